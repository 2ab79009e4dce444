// Command gonvmlprobe drives NVIDIA's Go bindings for NVML (github.com/NVIDIA/go-nvml, as NVIDIA's DRA driver,
// device plugin and container toolkit use them) one call at a time, for the C-API differential test of the simulated
// libnvidia-ml (tests/test_libnvml_differential.py).
//
//	gonvmlprobe /path/to/libnvidia-ml.so.1
//
// reads one JSON request a line on stdin and writes one JSON answer a line on stdout:
//
//	{"fn": "nvmlDeviceGetHandleByIndex", "args": [0], "save": "d0"}  ->  {"rc": 0, "value": 1099511627776}
//
// Functions are named as in pynvml (and nvml.h); arguments are numbers, strings or {"var": name}, a value an earlier
// request saved (a handle, a UUID), or {"var": name, "field": f}, one field of a saved struct. Handles are written as their addresses, structs as objects keyed by pynvml's
// field names (the Go field name with its first letter lowered), char arrays as strings, booleans as 0 or 1.
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"unicode"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

type request struct {
	Fn   string            `json:"fn"`
	Args []json.RawMessage `json:"args"`
	Save string            `json:"save,omitempty"`
}

type answer struct {
	Rc    int    `json:"rc"`
	Value any    `json:"value"`
	Probe string `json:"probe,omitempty"` // the probe's own failure (an unknown function, a bad argument)
}

type probe struct {
	lib  nvml.Interface
	vars map[string]any
	args []json.RawMessage
}

type probeError string

func (p *probe) arg(i int) any {
	if i >= len(p.args) {
		panic(probeError(fmt.Sprintf("argument %d missing", i)))
	}
	var ref struct {
		Var   string `json:"var"`
		Field string `json:"field"`
	}
	if json.Unmarshal(p.args[i], &ref) == nil && ref.Var != "" {
		v, ok := p.vars[ref.Var]
		if !ok {
			panic(probeError("no saved value " + ref.Var))
		}
		if ref.Field == "" {
			return v
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Struct {
			panic(probeError(ref.Var + " is not a struct"))
		}
		f := rv.FieldByName(strings.ToUpper(ref.Field[:1]) + ref.Field[1:])
		if !f.IsValid() {
			panic(probeError(ref.Var + " has no field " + ref.Field))
		}
		if f.CanInt() {
			return int(f.Int())
		}
		if f.CanUint() {
			return int(f.Uint())
		}
		return f.Interface()
	}
	var v any
	if err := json.Unmarshal(p.args[i], &v); err != nil {
		panic(probeError(err.Error()))
	}
	return v
}

func (p *probe) int(i int) int {
	switch v := p.arg(i).(type) {
	case float64:
		return int(v)
	case int:
		return v
	}
	panic(probeError(fmt.Sprintf("argument %d is not a number", i)))
}

func (p *probe) str(i int) string {
	if s, ok := p.arg(i).(string); ok {
		return s
	}
	panic(probeError(fmt.Sprintf("argument %d is not a string", i)))
}

func (p *probe) device(i int) nvml.Device {
	if d, ok := p.arg(i).(nvml.Device); ok {
		return d
	}
	panic(probeError(fmt.Sprintf("argument %d is not a device", i)))
}

func (p *probe) gpuInstance(i int) nvml.GpuInstance {
	if d, ok := p.arg(i).(nvml.GpuInstance); ok {
		return d
	}
	panic(probeError(fmt.Sprintf("argument %d is not a GPU instance", i)))
}

func (p *probe) computeInstance(i int) nvml.ComputeInstance {
	if d, ok := p.arg(i).(nvml.ComputeInstance); ok {
		return d
	}
	panic(probeError(fmt.Sprintf("argument %d is not a compute instance", i)))
}

func (p *probe) eventSet(i int) nvml.EventSet {
	if d, ok := p.arg(i).(nvml.EventSet); ok {
		return d
	}
	panic(probeError(fmt.Sprintf("argument %d is not an event set", i)))
}

// uuid is nvml.h's nvmlUUID_t for a "GPU-..." or "MIG-..." UUID: its text (NVML_UUID_TYPE_ASCII) or its 16 bytes.
func (p *probe) uuid(text string, kind int) *nvml.UUID {
	u := nvml.UUID{Type: uint32(kind)}
	u.Version = nvml.STRUCT_VERSION(u, 1)
	if nvml.UUIDType(kind) == nvml.UUID_TYPE_BINARY {
		raw, err := hex.DecodeString(strings.ReplaceAll(text[4:], "-", ""))
		if err != nil || len(raw) != 16 {
			panic(probeError("not a UUID: " + text))
		}
		copy(u.Value[:], raw)
	} else {
		copy(u.Value[:], text)
	}
	return &u
}

func (p *probe) gpuProfile(id, count int) *nvml.GpuInstanceProfileInfo {
	return &nvml.GpuInstanceProfileInfo{Id: uint32(id), InstanceCount: uint32(count)}
}

func (p *probe) ciProfile(id, count int) *nvml.ComputeInstanceProfileInfo {
	return &nvml.ComputeInstanceProfileInfo{Id: uint32(id), InstanceCount: uint32(count)}
}

// call runs one request: the value to save, and the return code.
func (p *probe) call(fn string) (any, nvml.Return) {
	switch fn {
	case "nvmlInit":
		return nil, p.lib.Init()
	case "nvmlInitWithFlags":
		return nil, p.lib.InitWithFlags(uint32(p.int(0)))
	case "nvmlShutdown":
		return nil, p.lib.Shutdown()
	case "nvmlErrorString":
		return p.lib.ErrorString(nvml.Return(p.int(0))), nvml.SUCCESS
	case "lookupSymbol":
		if err := p.lib.Extensions().LookupSymbol(p.str(0)); err != nil {
			return err.Error(), nvml.ERROR_FUNCTION_NOT_FOUND
		}
		return nil, nvml.SUCCESS
	case "nvmlSystemGetDriverVersion":
		return p.lib.SystemGetDriverVersion()
	case "nvmlSystemGetNVMLVersion":
		return p.lib.SystemGetNVMLVersion()
	case "nvmlSystemGetCudaDriverVersion":
		return p.lib.SystemGetCudaDriverVersion()
	case "nvmlSystemGetCudaDriverVersion_v2":
		return p.lib.SystemGetCudaDriverVersion_v2()
	case "nvmlDeviceGetCount":
		return p.lib.DeviceGetCount()
	case "nvmlDeviceGetHandleByIndex":
		return p.lib.DeviceGetHandleByIndex(p.int(0))
	case "nvmlDeviceGetHandleByUUID":
		return p.lib.DeviceGetHandleByUUID(p.str(0))
	case "nvmlDeviceGetHandleByUUIDV":
		return p.lib.DeviceGetHandleByUUIDV(p.uuid(p.str(0), p.int(1)))
	case "nvmlDeviceGetHandleByPciBusId":
		return p.lib.DeviceGetHandleByPciBusId(p.str(0))
	case "nvmlDeviceGetName":
		return p.device(0).GetName()
	case "nvmlDeviceGetUUID":
		return p.device(0).GetUUID()
	case "nvmlDeviceGetMinorNumber":
		return p.device(0).GetMinorNumber()
	case "nvmlDeviceGetIndex":
		return p.device(0).GetIndex()
	case "nvmlDeviceGetPciInfo":
		return p.device(0).GetPciInfo()
	case "nvmlDeviceGetMemoryInfo":
		return p.device(0).GetMemoryInfo()
	case "nvmlDeviceGetMemoryInfo_v2":
		return p.device(0).GetMemoryInfo_v2()
	case "nvmlDeviceGetBrand":
		return p.device(0).GetBrand()
	case "nvmlDeviceGetArchitecture":
		return p.device(0).GetArchitecture()
	case "nvmlDeviceGetCudaComputeCapability":
		major, minor, ret := p.device(0).GetCudaComputeCapability()
		return []int{major, minor}, ret
	case "nvmlDeviceGetVirtualizationMode":
		return p.device(0).GetVirtualizationMode()
	case "nvmlDeviceGetComputeMode":
		return p.device(0).GetComputeMode()
	case "nvmlDeviceSetComputeMode":
		return nil, p.device(0).SetComputeMode(nvml.ComputeMode(p.int(1)))
	case "nvmlDeviceGetMigMode":
		current, pending, ret := p.device(0).GetMigMode()
		return []int{current, pending}, ret
	case "nvmlDeviceSetMigMode":
		status, ret := p.device(0).SetMigMode(p.int(1))
		return int(status), ret
	case "nvmlDeviceGetGpuInstanceProfileInfo":
		switch p.int(2) {
		case 1:
			return p.device(0).GetGpuInstanceProfileInfo(p.int(1))
		case 2:
			return p.device(0).GetGpuInstanceProfileInfoV(p.int(1)).V2()
		default:
			return p.device(0).GetGpuInstanceProfileInfoV(p.int(1)).V3()
		}
	case "nvmlDeviceGetGpuInstanceProfileInfoById":
		if p.int(2) == 2 {
			return p.device(0).GetGpuInstanceProfileInfoByIdV(p.int(1)).V2()
		}
		return p.device(0).GetGpuInstanceProfileInfoByIdV(p.int(1)).V3()
	case "nvmlDeviceGetGpuInstancePossiblePlacements":
		return p.device(0).GetGpuInstancePossiblePlacements(p.gpuProfile(p.int(1), 0))
	case "nvmlDeviceGetGpuInstanceRemainingCapacity":
		return p.device(0).GetGpuInstanceRemainingCapacity(p.gpuProfile(p.int(1), 0))
	case "nvmlDeviceCreateGpuInstance":
		return p.device(0).CreateGpuInstance(p.gpuProfile(p.int(1), 0))
	case "nvmlDeviceCreateGpuInstanceWithPlacement":
		placement := nvml.GpuInstancePlacement{Start: uint32(p.int(2)), Size: uint32(p.int(3))}
		return p.device(0).CreateGpuInstanceWithPlacement(p.gpuProfile(p.int(1), 0), &placement)
	case "nvmlDeviceGetGpuInstances":
		return p.device(0).GetGpuInstances(p.gpuProfile(p.int(1), p.int(2)))
	case "nvmlDeviceGetGpuInstanceById":
		return p.device(0).GetGpuInstanceById(p.int(1))
	case "nvmlGpuInstanceGetInfo":
		return p.gpuInstance(0).GetInfo()
	case "nvmlGpuInstanceDestroy":
		return nil, p.gpuInstance(0).Destroy()
	case "nvmlGpuInstanceGetComputeInstanceProfileInfo":
		gi, profile, engine := p.gpuInstance(0), p.int(1), p.int(2)
		switch p.int(3) {
		case 1:
			return gi.GetComputeInstanceProfileInfo(profile, engine)
		case 2:
			return gi.GetComputeInstanceProfileInfoV(profile, engine).V2()
		default:
			return gi.GetComputeInstanceProfileInfoV(profile, engine).V3()
		}
	case "nvmlGpuInstanceGetComputeInstanceRemainingCapacity":
		return p.gpuInstance(0).GetComputeInstanceRemainingCapacity(p.ciProfile(p.int(1), 0))
	case "nvmlGpuInstanceGetComputeInstancePossiblePlacements":
		return p.gpuInstance(0).GetComputeInstancePossiblePlacements(p.ciProfile(p.int(1), 0))
	case "nvmlGpuInstanceCreateComputeInstance":
		return p.gpuInstance(0).CreateComputeInstance(p.ciProfile(p.int(1), 0))
	case "nvmlGpuInstanceCreateComputeInstanceWithPlacement":
		placement := nvml.ComputeInstancePlacement{Start: uint32(p.int(2)), Size: uint32(p.int(3))}
		return p.gpuInstance(0).CreateComputeInstanceWithPlacement(p.ciProfile(p.int(1), 0), &placement)
	case "nvmlGpuInstanceGetComputeInstances":
		return p.gpuInstance(0).GetComputeInstances(p.ciProfile(p.int(1), p.int(2)))
	case "nvmlGpuInstanceGetComputeInstanceById":
		return p.gpuInstance(0).GetComputeInstanceById(p.int(1))
	case "nvmlComputeInstanceGetInfo":
		return p.computeInstance(0).GetInfo()
	case "nvmlComputeInstanceDestroy":
		return nil, p.computeInstance(0).Destroy()
	case "nvmlDeviceIsMigDeviceHandle":
		return p.device(0).IsMigDeviceHandle()
	case "nvmlDeviceGetGpuInstanceId":
		return p.device(0).GetGpuInstanceId()
	case "nvmlDeviceGetComputeInstanceId":
		return p.device(0).GetComputeInstanceId()
	case "nvmlDeviceGetMaxMigDeviceCount":
		return p.device(0).GetMaxMigDeviceCount()
	case "nvmlDeviceGetMigDeviceHandleByIndex":
		return p.device(0).GetMigDeviceHandleByIndex(p.int(1))
	case "nvmlDeviceGetDeviceHandleFromMigDeviceHandle":
		return p.device(0).GetDeviceHandleFromMigDeviceHandle()
	case "nvmlDeviceGetAttributes":
		return p.device(0).GetAttributes()
	case "nvmlEventSetCreate":
		return p.lib.EventSetCreate()
	case "nvmlEventSetFree":
		return nil, p.eventSet(0).Free()
	case "nvmlDeviceRegisterEvents":
		return nil, p.device(0).RegisterEvents(uint64(p.int(1)), p.eventSet(2))
	case "nvmlDeviceGetSupportedEventTypes":
		return p.device(0).GetSupportedEventTypes()
	case "nvmlEventSetWait":
		return p.eventSet(0).Wait(uint32(p.int(1)))
	case "nvmlDeviceGetUtilizationRates":
		return p.device(0).GetUtilizationRates()
	case "nvmlDeviceGetTemperature":
		return p.device(0).GetTemperature(nvml.TemperatureSensors(p.int(1)))
	case "nvmlDeviceGetPowerUsage":
		return p.device(0).GetPowerUsage()
	case "nvmlDeviceGetTotalEccErrors":
		return p.device(0).GetTotalEccErrors(nvml.MemoryErrorType(p.int(1)), nvml.EccCounterType(p.int(2)))
	// The board: modes, identity, PCIe link, power limits, clocks, topology, fabric.
	case "nvmlDeviceGetPersistenceMode":
		return p.device(0).GetPersistenceMode()
	case "nvmlDeviceGetDisplayMode":
		return p.device(0).GetDisplayMode()
	case "nvmlDeviceGetDisplayActive":
		return p.device(0).GetDisplayActive()
	case "nvmlDeviceGetEccMode":
		current, pending, ret := p.device(0).GetEccMode()
		return []int{int(current), int(pending)}, ret
	case "nvmlDeviceGetSerial":
		return p.device(0).GetSerial()
	case "nvmlDeviceGetBoardId":
		return p.device(0).GetBoardId()
	case "nvmlDeviceGetMaxPcieLinkGeneration":
		return p.device(0).GetMaxPcieLinkGeneration()
	case "nvmlDeviceGetGpuMaxPcieLinkGeneration":
		return p.device(0).GetGpuMaxPcieLinkGeneration()
	case "nvmlDeviceGetCurrPcieLinkGeneration":
		return p.device(0).GetCurrPcieLinkGeneration()
	case "nvmlDeviceGetMaxPcieLinkWidth":
		return p.device(0).GetMaxPcieLinkWidth()
	case "nvmlDeviceGetCurrPcieLinkWidth":
		return p.device(0).GetCurrPcieLinkWidth()
	case "nvmlDeviceGetPowerManagementLimit":
		return p.device(0).GetPowerManagementLimit()
	case "nvmlDeviceGetPowerManagementDefaultLimit":
		return p.device(0).GetPowerManagementDefaultLimit()
	case "nvmlDeviceGetEnforcedPowerLimit":
		return p.device(0).GetEnforcedPowerLimit()
	case "nvmlDeviceGetPowerManagementLimitConstraints":
		low, high, ret := p.device(0).GetPowerManagementLimitConstraints()
		return []int{int(low), int(high)}, ret
	case "nvmlDeviceGetMaxClockInfo":
		return p.device(0).GetMaxClockInfo(nvml.ClockType(p.int(1)))
	case "nvmlDeviceGetClockInfo":
		return p.device(0).GetClockInfo(nvml.ClockType(p.int(1)))
	case "nvmlDeviceGetTopologyCommonAncestor":
		return p.device(0).GetTopologyCommonAncestor(p.device(1))
	case "nvmlDeviceGetGpuFabricInfo":
		info, ret := p.device(0).GetGpuFabricInfo()
		return fabric(info.ClusterUuid, info.Status, info.CliqueId, info.State, nil), ret
	case "nvmlDeviceGetGpuFabricInfoV":
		info, ret := p.device(0).GetGpuFabricInfoV().V2()
		return fabric(info.ClusterUuid, info.Status, info.CliqueId, info.State, &info.HealthMask), ret
	case "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
		"nvmlDeviceGetComputeRunningProcesses_v3":
		return p.device(0).GetComputeRunningProcesses()
	case "nvmlDeviceGetGraphicsRunningProcesses":
		return p.device(0).GetGraphicsRunningProcesses()
	case "nvmlDeviceGetMPSComputeRunningProcesses":
		return p.device(0).GetMPSComputeRunningProcesses()
	// One the simulator does not model (a GPU that is not a NUMA node of its own): NOT_SUPPORTED.
	case "nvmlDeviceGetNumaNodeId":
		return p.device(0).GetNumaNodeId()
	}
	panic(probeError("unknown function " + fn))
}

// fabric is a GPU's fabric info as the differential test compares it: the cluster UUID as text.
func fabric(cluster [16]uint8, status, clique uint32, state uint8, health *uint32) map[string]any {
	b := cluster[:]
	out := map[string]any{
		"clusterUuid": fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]),
		"status":      status,
		"cliqueId":    clique,
		"state":       state,
	}
	if health != nil {
		out["healthMask"] = *health
	}
	return out
}

// value turns what go-nvml returned into JSON: handles as addresses, structs keyed by pynvml's field names.
func value(v any) any {
	if v == nil {
		return nil
	}
	switch t := v.(type) {
	case nvml.Device, nvml.GpuInstance, nvml.ComputeInstance, nvml.EventSet:
		return handleAddress(t)
	case bool:
		if t {
			return 1
		}
		return 0
	case string:
		return t
	case map[string]any:
		out := map[string]any{}
		for k, x := range t {
			out[k] = value(x)
		}
		return out
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Struct:
		out := map[string]any{}
		for i := 0; i < rv.NumField(); i++ {
			f := rv.Type().Field(i)
			if !f.IsExported() || strings.HasPrefix(f.Name, "Pad_cgo") {
				continue
			}
			out[lowerFirst(f.Name)] = field(rv.Field(i))
		}
		return out
	case reflect.Slice:
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = value(rv.Index(i).Interface())
		}
		return out
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.Uint()
	}
	return fmt.Sprintf("%v", v)
}

func field(fv reflect.Value) any {
	if fv.Kind() == reflect.Array && fv.Type().Elem().Kind() == reflect.Int8 {
		b := make([]byte, 0, fv.Len())
		for i := 0; i < fv.Len() && fv.Index(i).Int() != 0; i++ {
			b = append(b, byte(fv.Index(i).Int()))
		}
		return string(b)
	}
	if fv.Kind() == reflect.Interface {
		if fv.IsNil() {
			return 0
		}
		return value(fv.Interface())
	}
	return value(fv.Interface())
}

// handleAddress is the C pointer inside one of go-nvml's handle types (a struct whose one field is the pointer).
func handleAddress(h any) any {
	rv := reflect.ValueOf(h)
	if rv.Kind() == reflect.Struct && rv.NumField() == 1 && rv.Field(0).Kind() == reflect.Pointer {
		return uint64(rv.Field(0).Pointer())
	}
	return fmt.Sprintf("%v", h)
}

func lowerFirst(s string) string {
	r := []rune(s)
	r[0] = unicode.ToLower(r[0])
	return string(r)
}

func (p *probe) serve(line []byte) (a answer) {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return answer{Rc: -1, Probe: err.Error()}
	}
	defer func() {
		if r := recover(); r != nil {
			msg, ok := r.(probeError)
			if !ok {
				panic(r)
			}
			a = answer{Rc: -1, Probe: string(msg)}
		}
	}()
	p.args = req.Args
	v, ret := p.call(req.Fn)
	if req.Save != "" && ret == nvml.SUCCESS {
		p.vars[req.Save] = v
	}
	return answer{Rc: int(ret), Value: value(v)}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gonvmlprobe /path/to/libnvidia-ml.so.1")
		os.Exit(2)
	}
	p := &probe{lib: nvml.New(nvml.WithLibraryPath(os.Args[1])), vars: map[string]any{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		if err := out.Encode(p.serve(in.Bytes())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
