// Pins kind (sigs.k8s.io/kind) for the kind-based cluster tests (tests/cluster/kind*); scripts/build-kind-tools.sh
// builds the `tool` into the cache. A module of its own so that every dependency is at kind's own pins (one module
// with k8s.io/kubernetes would raise them to Kubernetes').
module example.invalid/dra-driver/tools/kindnode/kind

go 1.26.0

// kind's go.mod says `go 1.17`, for which Go uses the GODEBUG defaults of go1.20: keep those, as upstream's build does.
godebug default=go1.20

tool sigs.k8s.io/kind

require (
	al.essio.dev/pkg/shellescape v1.5.1 // indirect
	github.com/BurntSushi/toml v1.4.0 // indirect
	github.com/evanphx/json-patch/v5 v5.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/spf13/cobra v1.8.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/sys v0.6.0 // indirect
	sigs.k8s.io/kind v0.33.0 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
)
