// Command etcd is etcd's own server main (go.etcd.io/etcd/server/v3/main.go), built at the version
// that k8s.io/kubernetes selects.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
