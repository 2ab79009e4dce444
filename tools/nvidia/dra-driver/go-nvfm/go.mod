// A stand-in for NVIDIA's Fabric Manager bindings (github.com/NVIDIA/go-nvfm, not served by the module proxy), given to
// the DRA driver's wrapper module by `replace`: only the surface its pkg/fabricmanager uses, every call answering
// NOT_SUPPORTED, as on a node without Fabric Manager (a simulated one).
module github.com/NVIDIA/go-nvfm

go 1.26.0
