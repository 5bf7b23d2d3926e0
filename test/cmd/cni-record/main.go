// Command cni-record is a chained CNI plugin for the local cluster's tests:
// it appends one line per call to the file named by its "recordFile"
// setting (command, pod namespace/name from CNI_ARGS, netns, interface)
// and passes the previous plugin's result on unchanged. Installed into a
// node's CNI bin dir and appended to its conflist, it shows that pods run
// the node's chain as a runtime does, ADD and DEL.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.PluginConf
	RecordFile string `json:"recordFile"`
}

func parse(stdin []byte) (*conf, error) {
	var c conf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	if c.RecordFile == "" {
		return nil, fmt.Errorf("recordFile is required")
	}
	return &c, nil
}

func record(cmd string, args *skel.CmdArgs) (*conf, error) {
	c, err := parse(args.StdinData)
	if err != nil {
		return nil, err
	}
	pod := map[string]string{}
	for _, kv := range strings.Split(args.Args, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			pod[k] = v
		}
	}
	f, err := os.OpenFile(c.RecordFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%s %s/%s netns=%s if=%s prev=%v\n", cmd, pod["K8S_POD_NAMESPACE"], pod["K8S_POD_NAME"],
		args.Netns, args.IfName, c.RawPrevResult != nil)
	return c, err
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: func(args *skel.CmdArgs) error {
			c, err := record("ADD", args)
			if err != nil {
				return err
			}
			if err := version.ParsePrevResult(&c.PluginConf); err != nil {
				return err
			}
			if c.PrevResult == nil {
				return fmt.Errorf("cni-record must be chained after a plugin that returns a result")
			}
			return types.PrintResult(c.PrevResult, c.CNIVersion)
		},
		Del: func(args *skel.CmdArgs) error {
			_, err := record("DEL", args)
			return err
		},
		Check: func(args *skel.CmdArgs) error {
			_, err := record("CHECK", args)
			return err
		},
	}, version.All, "cni-record: records CNI calls for the local cluster's tests")
}
