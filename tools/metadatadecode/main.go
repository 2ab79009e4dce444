// metadatadecode reads a DRA device metadata file as a consumer built on k8s.io/dynamic-resource-allocation does
// (devicemetadata.DecodeMetadataFromStream, as KubeVirt and the package's ReadResourceClaimMetadata use it), and
// encodes what it decoded again as the Go kubelet plugin helper (kubeletplugin's metadataWriter) writes it. It is the
// reference side of tests/test_device_metadata.py.
//
// Usage: metadatadecode FILE. Output, one JSON object on stdout:
//
//	{"gvk": the version the whole stream decoded from (the first one this library knows),
//	 "decoded": that object as v1beta1 JSON, "validation": upstream's declarative validation error or "",
//	 "objects": [{"gvk", "decoded", "validation"} for each object of the stream decoded alone: what a consumer that
//	             knows only that version reads],
//	 "reencoded": the stream upstream's writer makes of the decoded object, for the versions the stream holds, in
//	              its order}
//
// A stream the decoder refuses exits 1 with the error on stderr.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

type decoded struct {
	GVK        string                          `json:"gvk"`
	Decoded    *metadatav1beta1.DeviceMetadata `json:"decoded"`
	Validation string                          `json:"validation"`
}

type output struct {
	decoded
	Objects   []decoded `json:"objects"`
	Reencoded string    `json:"reencoded"`
}

func decode(data []byte) (decoded, schema.GroupVersionKind, error) {
	var dm metadatav1beta1.DeviceMetadata
	var gvk schema.GroupVersionKind
	var validation error
	err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &dm,
		devicemetadata.DecodeMetadataStoreGVKResult(&gvk), devicemetadata.DecodeMetadataWithValidationResult(&validation))
	if err != nil {
		return decoded{}, gvk, err
	}
	d := decoded{GVK: gvk.String(), Decoded: &dm}
	if validation != nil {
		d.Validation = validation.Error()
	}
	return d, gvk, nil
}

// reencode writes the internal object as kubeletplugin's metadataWriter.encodeMetadataStream does: the scheme's
// pretty JSON serializer, one object per version, each followed by a newline.
func reencode(data []byte, versions []schema.GroupVersion) (string, error) {
	var dm metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &dm); err != nil {
		return "", err
	}
	scheme := install.NewScheme()
	codecs := runtimeserializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return "", fmt.Errorf("no JSON serializer")
	}
	var buf bytes.Buffer
	for _, gv := range versions {
		out, err := runtime.Encode(codecs.EncoderForVersion(info.PrettySerializer, gv), &dm)
		if err != nil {
			return "", fmt.Errorf("encode %s: %w", gv, err)
		}
		buf.Write(out)
		buf.WriteByte('\n')
	}
	return buf.String(), nil
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: metadatadecode FILE")
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		return err
	}
	whole, _, err := decode(data)
	if err != nil {
		return err
	}
	out := output{decoded: whole}
	var versions []schema.GroupVersion
	stream := json.NewDecoder(bytes.NewReader(data))
	for stream.More() {
		var raw json.RawMessage
		if err := stream.Decode(&raw); err != nil {
			return err
		}
		one, gvk, err := decode(raw)
		if err != nil {
			return fmt.Errorf("object %d alone: %w", len(out.Objects), err)
		}
		out.Objects = append(out.Objects, one)
		versions = append(versions, gvk.GroupVersion())
	}
	if out.Reencoded, err = reencode(data, versions); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "metadatadecode:", err)
		os.Exit(1)
	}
}
