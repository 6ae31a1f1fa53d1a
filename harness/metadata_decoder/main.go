// metadata-decoder reads a DRA device metadata file with Kubernetes' own reader
// (k8s.io/dynamic-resource-allocation/devicemetadata), validation on, as a container's
// program would, and (second argument) a CDI spec with the CDI library the runtimes use:
// the tests check that what dranet writes is what consumers accept.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: metadata-decoder FILE [CDI-SPEC]")
		os.Exit(2)
	}
	cdiDevices := []string{}
	if len(os.Args) == 3 {
		spec, err := cdi.ReadSpec(os.Args[2], 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cdi:", err)
			os.Exit(1)
		}
		for _, d := range spec.Devices {
			cdiDevices = append(cdiDevices, spec.Kind+"="+d.Name)
		}
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	var dm metadata.DeviceMetadata
	var invalid error
	var gvk schema.GroupVersionKind
	err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(f), &dm,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid),
		devicemetadata.DecodeMetadataStoreGVKResult(&gvk))
	if err != nil {
		fmt.Fprintln(os.Stderr, "decode:", err)
		os.Exit(1)
	}
	if invalid != nil {
		fmt.Fprintln(os.Stderr, "invalid:", invalid)
		os.Exit(1)
	}
	devices, interfaces := 0, []string{}
	for _, r := range dm.Requests {
		for _, d := range r.Devices {
			devices++
			name := ""
			if d.NetworkData != nil {
				name = d.NetworkData.InterfaceName
			}
			interfaces = append(interfaces, name)
		}
	}
	out, _ := json.Marshal(map[string]any{
		"gvk": gvk.String(), "generation": dm.Generation, "devices": devices, "interfaces": interfaces,
		"podClaimName": dm.PodClaimName, "cdiDevices": cdiDevices,
	})
	fmt.Println(string(out))
}
