// allocbench runs the kube-scheduler's structured allocator (k8s.io/dynamic-resource-allocation/structured) the way
// the DynamicResources plugin calls it, on JSON input, and prints the per-claim results and the time taken. It is the
// Go baseline of bench/bench_allocator.py and the reference of tests/test_allocbench.py.
//
// Input (stdin): one or more JSON values {"slices": [...], "classes": [...], "claims": [...], "nodes": ["node-a", ...], "repeat": 1,
// "deviceTaintRules": [...], "features": {"DeviceBindingAndStatus": false, ...}}
// DeviceTaintRules (resource.k8s.io/v1; v1beta2 has the same fields) are applied to the slices by the scheduler's own
// ResourceSlice tracker (k8s.io/dynamic-resource-allocation/resourceslice/tracker, fed by informers of a fake
// clientset), as the DRADeviceTaintRules gate makes the scheduler do; "features" overrides the 1.37 scheduler's
// allocator features.
// Each claim is a pod of its own, scheduled in order: one allocator per claim (PreFilter), then Allocate on the nodes
// starting at node (i mod len(nodes)) until one fits (Filter); what a claim got counts as allocated for the next.
// Output (stdout): one line per input value, {"results": [{"claim", "node", "devices": [{"request", "driver", "pool", "device", "shared",
// "consumedCapacity", "bindingConditions", "bindingFailureConditions"}], "nodeSelector", "error"}],
// "seconds": best of the repeats, "allocate_calls": Allocate calls per repeat}.
//
// `allocbench numa <sysfs root> <bdf>...` instead prints, for each PCI device, the `numaNode` attribute of
// k8s.io/dynamic-resource-allocation/deviceattribute's GetNUMANodeAttributeByPCIBusID read from that sysfs tree, in
// both forms: {"bdf", "scalar": DeviceAttribute, "list": DeviceAttribute, "error"} (the reference of
// tests/test_numa_differential.py; the same module pins as the allocator, so one build serves both).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
)

type input struct {
	Slices     []*resourceapi.ResourceSlice   `json:"slices"`
	Classes    []*resourceapi.DeviceClass     `json:"classes"`
	Claims     []*resourceapi.ResourceClaim   `json:"claims"`
	Nodes      []string                       `json:"nodes"`
	Repeat     int                            `json:"repeat"`
	TaintRules []*resourceapi.DeviceTaintRule `json:"deviceTaintRules"`
	Features   *structured.Features           `json:"features"`
}

type device struct {
	Request                  string                                          `json:"request"`
	Driver                   string                                          `json:"driver"`
	Pool                     string                                          `json:"pool"`
	Device                   string                                          `json:"device"`
	Shared                   bool                                            `json:"shared,omitempty"`
	ConsumedCapacity         map[resourceapi.QualifiedName]resource.Quantity `json:"consumedCapacity,omitempty"`
	BindingConditions        []string                                        `json:"bindingConditions,omitempty"`
	BindingFailureConditions []string                                        `json:"bindingFailureConditions,omitempty"`
}

type result struct {
	Claim        string           `json:"claim"`
	Node         string           `json:"node,omitempty"`
	Devices      []device         `json:"devices"`
	NodeSelector *v1.NodeSelector `json:"nodeSelector,omitempty"`
	Error        string           `json:"error,omitempty"`
}

type output struct {
	Results       []result `json:"results"`
	Seconds       float64  `json:"seconds"`
	AllocateCalls int      `json:"allocate_calls"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass.resource.k8s.io %q not found", name)
}

// defaultFeatures are the scheduler's with Kubernetes 1.37's default gates (pkg/features/kube_features.go and
// dynamicresources.go's AllocatorFeatures): DRADeviceBindingConditions (beta) and DRAResourceClaimDeviceStatus (GA)
// are on, so DeviceBindingAndStatus is too; DRAFractionalCapacityRange is beta and on; DRAListTypeAttributes,
// DRAOptionalNodeOperations, DRADerivedAttributes and DRADeviceCompatibilityGroups are alpha and off.
var defaultFeatures = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// patchedSlices are the slices as the scheduler's tracker shows them with the DeviceTaintRules applied.
func patchedSlices(ctx context.Context, in *input) ([]*resourceapi.ResourceSlice, error) {
	if len(in.TaintRules) == 0 {
		return in.Slices, nil
	}
	objects := []runtime.Object{}
	for _, s := range in.Slices {
		objects = append(objects, s)
	}
	for _, r := range in.TaintRules {
		objects = append(objects, r)
	}
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset(objects...)
	factory := informers.NewSharedInformerFactory(client, 0)
	defer func() { cancel(); factory.Shutdown() }() // informers stop with the context, then Shutdown waits for them
	t, err := tracker.StartTracker(ctx, tracker.Options{
		EnableDeviceTaintRules:   true,
		EnableConsumableCapacity: true,
		SliceInformer:            factory.Resource().V1().ResourceSlices(),
		TaintInformer:            factory.Resource().V1().DeviceTaintRules(),
	})
	if err != nil {
		return nil, err
	}
	defer t.Stop()
	factory.Start(ctx.Done())
	// Polled every millisecond, not at cache.WaitForCacheSync's 100 ms: the fake clientset syncs at once, and the
	// differential tests run hundreds of scenarios through one process.
	for deadline := time.Now().Add(time.Minute); !t.HasSynced(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, errors.New("the ResourceSlice tracker did not sync")
		}
	}
	patched, err := t.ListPatchedResourceSlices()
	if err != nil {
		return nil, err
	}
	// the tracker lists in its store's order: back to the input's, which is the allocator's search order
	byName := map[string]*resourceapi.ResourceSlice{}
	for _, s := range patched {
		byName[s.Name] = s
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(in.Slices))
	for _, s := range in.Slices {
		out = append(out, byName[s.Name])
	}
	return out, nil
}

func run(ctx context.Context, in *input, slices []*resourceapi.ResourceSlice) ([]result, int, error) {
	features := defaultFeatures
	if in.Features != nil {
		features = *in.Features
	}
	classes := classLister{}
	for _, c := range in.Classes {
		classes[c.Name] = c
	}
	nodes := make([]*v1.Node, len(in.Nodes))
	for i, name := range in.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	}
	// The scheduler's cache size and CEL features (dynamicresources.go).
	celCache := cel.NewCache(10, cel.Features{
		EnableConsumableCapacity: features.ConsumableCapacity,
		EnableListTypeAttributes: features.ListTypeAttributes,
	})
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	results := make([]result, 0, len(in.Claims))
	calls := 0
	for i, claim := range in.Claims {
		r := result{Claim: claim.Namespace + "/" + claim.Name, Devices: []device{}}
		alloc, err := structured.NewAllocator(ctx, features, state, classes, slices, celCache)
		if err != nil {
			return nil, 0, err
		}
		for k := range nodes {
			node := nodes[(i+k)%len(nodes)]
			calls++
			got, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			if errors.Is(err, structured.ErrFailedAllocationOnNode) {
				continue
			}
			if err != nil {
				r.Error = err.Error()
				break
			}
			if got == nil {
				continue
			}
			r.Node = node.Name
			r.NodeSelector = got[0].NodeSelector
			for _, d := range got[0].Devices.Results {
				r.Devices = append(r.Devices, device{
					Request: d.Request, Driver: d.Driver, Pool: d.Pool, Device: d.Device, Shared: d.ShareID != nil,
					ConsumedCapacity: d.ConsumedCapacity, BindingConditions: d.BindingConditions,
					BindingFailureConditions: d.BindingFailureConditions,
				})
				id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
				if d.ShareID == nil {
					state.AllocatedDevices.Insert(id)
					continue
				}
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, d.ShareID))
				if d.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, d.ConsumedCapacity))
				}
			}
			break
		}
		results = append(results, r)
	}
	return results, calls, nil
}

type numaResult struct {
	BDF    string                       `json:"bdf"`
	Scalar *resourceapi.DeviceAttribute `json:"scalar,omitempty"`
	List   *resourceapi.DeviceAttribute `json:"list,omitempty"`
	Error  string                       `json:"error,omitempty"`
}

// numa prints upstream's numaNode attribute of each device in both forms; an error (no numa_node file, -1) leaves
// both out. The two forms read the same numa_node, so they fail together.
func numa(root string, bdfs []string) error {
	out := []numaResult{}
	for _, bdf := range bdfs {
		r := numaResult{BDF: bdf}
		scalar, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ScalarAttribute, deviceattribute.WithFSFromRoot(root))
		if err == nil {
			var list deviceattribute.DeviceAttribute
			list, err = deviceattribute.GetNUMANodeAttributeByPCIBusID(bdf, deviceattribute.ListAttribute, deviceattribute.WithFSFromRoot(root))
			r.Scalar, r.List = &scalar.Value, &list.Value
		}
		if err != nil {
			r.Scalar, r.List, r.Error = nil, nil, err.Error()
		}
		out = append(out, r)
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == "numa" {
		if err := numa(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, "allocbench numa:", err)
			os.Exit(1)
		}
		return
	}
	// One output line per input value on stdin, so a differential test pays the process's start (client-go's
	// init, about 0.3 s on 2 cores) once for all its scenarios instead of once per scenario.
	dec := json.NewDecoder(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	for {
		var in input
		err := dec.Decode(&in)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "allocbench: reading input:", err)
			os.Exit(2)
		}
		if err := enc.Encode(one(&in)); err != nil {
			fmt.Fprintln(os.Stderr, "allocbench:", err)
			os.Exit(1)
		}
	}
}

// one runs one input `repeat` times; a bad input ends the process (exit 1 or 2, the reason on stderr).
func one(in *input) output {
	if len(in.Nodes) == 0 {
		fmt.Fprintln(os.Stderr, "allocbench: no nodes")
		os.Exit(2)
	}
	repeat := max(in.Repeat, 1)
	ctx := context.Background()
	slices, err := patchedSlices(ctx, in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allocbench: applying DeviceTaintRules:", err)
		os.Exit(1)
	}
	var out output
	for range repeat {
		start := time.Now()
		results, calls, err := run(ctx, in, slices)
		took := time.Since(start).Seconds()
		if err != nil {
			fmt.Fprintln(os.Stderr, "allocbench:", err)
			os.Exit(1)
		}
		if out.Results == nil || took < out.Seconds {
			out.Seconds = took
		}
		out.Results, out.AllocateCalls = results, calls
	}
	return out
}
