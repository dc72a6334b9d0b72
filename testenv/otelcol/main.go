// Command otelcol is the OpenTelemetry Collector the trace tests export to:
// a minimal build of it with only the OTLP receiver (gRPC and HTTP) and the
// file exporter, so a test can read back the spans a program sent.
// testenv.OTelCollectorBinary builds it once per machine and caches it.
//
// It is a module of its own because Talos must not depend on the
// collector: its several hundred modules stay out of the main module's
// go.mod and go.sum, and out of `go build ./...` and `go test ./...` at the
// repository root, which skip a nested module. Every collector module here
// is of one release (core v0.161.0 / v1.67.0, contrib v0.161.0); move them
// together.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// components are the factories of the build: the OTLP receiver, the file
// exporter and the collector's own telemetry (which the tests turn off).
func components() (otelcol.Factories, error) {
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	var err error
	f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return f, err
	}
	f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	return f, err
}

func main() {
	info := component.BuildInfo{
		Command:     "otelcol-talos-test",
		Description: "OpenTelemetry Collector for the Talos tests: OTLP in, a JSON file out",
		Version:     "0.161.0",
	}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
			DefaultScheme:     "file",
		}},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
