// Command weft-cni is Weft's chained CNI plugin. The container runtime runs
// it for every pod sandbox; it tells the node agent about ambient pods
// before their containers start and passes the previous result through.
// See package cni/plugin.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/weftmesh/weft/cni/plugin"
)

func main() {
	p := plugin.New(os.Stdout, os.Stderr)
	skel.PluginMainFuncs(p.Funcs(), version.All, "weft-cni: Weft's ambient mesh CNI plugin")
}
