package web

import (
	"os"
	"testing"

	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }
