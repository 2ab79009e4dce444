// Package nvfm is a stand-in for NVIDIA's Fabric Manager bindings with the surface NVIDIA's DRA driver uses. No
// Fabric Manager library is loaded: every call answers NOT_SUPPORTED, so fabric partitioning is unavailable.
package nvfm

import "fmt"

// Return is fmReturn_t.
type Return int32

const (
	SUCCESS       Return = 0
	NOT_SUPPORTED Return = -3
)

func (r Return) String() string {
	switch r {
	case SUCCESS:
		return "SUCCESS"
	case NOT_SUPPORTED:
		return "NOT_SUPPORTED"
	}
	return fmt.Sprintf("UNKNOWN_ERROR (%d)", int32(r))
}

func (r Return) Error() string { return r.String() }

// FabricPartitionId is fmFabricPartitionId_t.
type FabricPartitionId uint32

// The array sizes of nv_fm_types.h (FM_UUID_BUFFER_SIZE, FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE, FM_MAX_NUM_GPUS,
// FM_MAX_FABRIC_PARTITIONS): the driver checks the counts it is given against them.
const (
	uuidBufferSize     = 80
	pciBusIdBufferSize = 32
	maxNumGpus         = 16
	maxFabricPartition = 64
)

// FabricPartitionGpuInfo is fmFabricPartitionGpuInfo_t.
type FabricPartitionGpuInfo struct {
	PhysicalId          uint32
	Uuid                [uuidBufferSize]int8
	PciBusId            [pciBusIdBufferSize]int8
	NumNvLinksAvailable uint32
	MaxNumNvLinks       uint32
	NvlinkLineRateMBps  uint32
}

// FabricPartitionInfo is fmFabricPartitionInfo_t.
type FabricPartitionInfo struct {
	PartitionId FabricPartitionId
	IsActive    uint32
	NumGpus     uint32
	GpuInfo     [maxNumGpus]FabricPartitionGpuInfo
}

// FabricPartitionList is fmFabricPartitionList_t.
type FabricPartitionList struct {
	Version          uint32
	NumPartitions    uint32
	MaxNumPartitions uint32
	PartitionInfo    [maxFabricPartition]FabricPartitionInfo
}

// Handle is one connection to Fabric Manager.
type Handle interface {
	Disconnect() Return
	GetSupportedFabricPartitions() (FabricPartitionList, Return)
	ActivateFabricPartition(FabricPartitionId) Return
	DeactivateFabricPartition(FabricPartitionId) Return
}

// Interface is the library.
type Interface interface {
	Init() Return
	Shutdown() Return
	Connect(...ConnectOption) (Handle, Return)
}

type libraryOptions struct{ path string }

// LibraryOption configures New.
type LibraryOption func(*libraryOptions)

// WithLibraryPath names libnvfm.so; the stand-in loads nothing.
func WithLibraryPath(path string) LibraryOption { return func(o *libraryOptions) { o.path = path } }

type connectOptions struct {
	address    string
	unixSocket bool
	timeoutMs  uint32
}

// ConnectOption configures Connect.
type ConnectOption func(*connectOptions)

func WithUnixSocket(path string) ConnectOption {
	return func(o *connectOptions) { o.address, o.unixSocket = path, true }
}

func WithAddress(address string) ConnectOption {
	return func(o *connectOptions) { o.address, o.unixSocket = address, false }
}

func WithTimeoutMs(ms uint32) ConnectOption { return func(o *connectOptions) { o.timeoutMs = ms } }

type library struct{ options libraryOptions }

// New returns the library; Init answers NOT_SUPPORTED.
func New(opts ...LibraryOption) Interface {
	l := &library{}
	for _, opt := range opts {
		opt(&l.options)
	}
	return l
}

func (*library) Init() Return     { return NOT_SUPPORTED }
func (*library) Shutdown() Return { return NOT_SUPPORTED }

func (*library) Connect(opts ...ConnectOption) (Handle, Return) {
	var o connectOptions
	for _, opt := range opts {
		opt(&o)
	}
	return handle{}, NOT_SUPPORTED
}

type handle struct{}

func (handle) Disconnect() Return { return NOT_SUPPORTED }

func (handle) GetSupportedFabricPartitions() (FabricPartitionList, Return) {
	return FabricPartitionList{}, NOT_SUPPORTED
}

func (handle) ActivateFabricPartition(FabricPartitionId) Return   { return NOT_SUPPORTED }
func (handle) DeactivateFabricPartition(FabricPartitionId) Return { return NOT_SUPPORTED }
