// refplugin is a reference DRA kubelet plugin on k8s.io/dynamic-resource-allocation/kubeletplugin, the helper the Go
// drivers use (as kubernetes-sigs/dra-example-driver does), with a minimal prepare: the helper reads each claim from
// the API server and checks its UID; prepare writes one CDI spec file per claim (one CDI device per allocated device of
// this driver) and returns the CDI device IDs; unprepare deletes the file. It publishes one fixed ResourceSlice for its
// node (--devices whole "GPUs", gpu-0..gpu-N-1, with a type attribute), so that start to slices published can be timed.
// It is the Go baseline of bench/bench_prepare.py; the socket layout flags are the Python plugin's.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type plugin struct {
	driver  string
	cdiRoot string
}

type cdiSpec struct {
	CDIVersion string      `json:"cdiVersion"`
	Kind       string      `json:"kind"`
	Devices    []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string         `json:"name"`
	ContainerEdits map[string]any `json:"containerEdits"`
}

func (p *plugin) kind() string { return "k8s." + p.driver + "/claim" }

func (p *plugin) specPath(uid types.UID) string {
	return filepath.Join(p.cdiRoot, "k8s."+p.driver+"-claim_"+string(uid)+".json")
}

func (p *plugin) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	spec := cdiSpec{CDIVersion: "0.6.0", Kind: p.kind()}
	var devices []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != p.driver {
			continue
		}
		name := string(claim.UID) + "-" + r.Device
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: map[string]any{
			"env": []string{"DRA_DEVICE=" + r.Device, "DRA_CLAIM=" + string(claim.UID)},
		}})
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{p.kind() + "=" + name},
		})
	}
	data, err := json.Marshal(spec)
	if err == nil {
		err = writeAtomic(p.specPath(claim.UID), data)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return kubeletplugin.PrepareResult{Devices: devices}
}

// writeAtomic: a reader (the container runtime) sees the whole spec or none, as with the Python plugin's writes.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = p.prepare(c)
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(p.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[c.UID] = err
	}
	return out, nil
}

func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func fixedSlice(driver string, count int) resourceslice.Slice {
	devices := make([]resourceapi.Device, count)
	for i := range devices {
		devices[i] = resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":  {StringValue: ptr.To("gpu")},
				"index": {IntValue: ptr.To(int64(i))},
			},
		}
	}
	return resourceslice.Slice{Devices: devices}
}

func main() {
	driver := flag.String("driver", "gpu.dra-driver.dev", "driver name")
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "node name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig (default: in-cluster)")
	pluginDir := flag.String("plugin-dir", "", "default /var/lib/kubelet/plugins/<driver>")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "kubelet plugin registry directory")
	cdiRoot := flag.String("cdi-root", "/var/run/cdi", "where CDI spec files are written")
	devices := flag.Int("devices", 8, "devices in the fixed ResourceSlice (0: publish none)")
	serialize := flag.Bool("serialize", true, "one gRPC call at a time (the helper's default, kept by the example driver)")
	// The example driver's defaults are 5 and 10; a negative QPS turns client-go's rate limiter off.
	qps := flag.Float64("kube-api-qps", 5, "client-go QPS (negative: no limit)")
	burst := flag.Int("kube-api-burst", 10, "client-go burst")
	klog.InitFlags(nil)
	flag.Parse()
	start := time.Now()
	if err := run(*driver, *nodeName, *kubeconfig, *pluginDir, *registryDir, *cdiRoot, *devices, *serialize,
		float32(*qps), *burst, start); err != nil {
		fmt.Fprintln(os.Stderr, "refplugin:", err)
		os.Exit(1)
	}
}

func run(driver, nodeName, kubeconfig, pluginDir, registryDir, cdiRoot string, devices int, serialize bool,
	qps float32, burst int, start time.Time) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var config, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = qps, burst
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driver)
	}
	for _, dir := range []string{pluginDir, registryDir, cdiRoot} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	p := &plugin{driver: driver, cdiRoot: cdiRoot}
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.DriverName(driver),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.Serialize(serialize),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	// bench_prepare.py reads this line to time start to serving from the process's own clock too.
	fmt.Printf("refplugin: serving after %.3f s\n", time.Since(start).Seconds())
	if devices > 0 {
		resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			nodeName: {Slices: []resourceslice.Slice{fixedSlice(driver, devices)}},
		}}
		if err := helper.PublishResources(ctx, resources); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}
