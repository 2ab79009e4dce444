// Helper module: gonvmlprobe, NVIDIA's Go bindings (github.com/NVIDIA/go-nvml, as NVIDIA's DRA driver, device plugin
// and container toolkit use them) driven line by line over stdin, the go-nvml side of the C-API differential test of
// the simulated libnvidia-ml (tests/test_libnvml_differential.py; built by scripts/build-gonvmlprobe.sh). The go-nvml
// pin is also the NVML header the simulated library exports (scripts/gen-libnvml-functions.sh).
module example.invalid/dra-driver/tools/gonvmlprobe

go 1.26.0

require github.com/NVIDIA/go-nvml v0.13.4-1
