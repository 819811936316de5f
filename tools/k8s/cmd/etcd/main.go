// Command etcd is upstream's etcd server, built from go.etcd.io/etcd/server/v3 at the version
// this module pins (the one k8s.io/kubernetes selects), for Rustlet's local test control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
