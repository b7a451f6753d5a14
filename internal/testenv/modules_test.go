package testenv

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// nestedOnly are modules that only a nested module of the repository needs,
// each with that module: they stay out of the library's go.mod, so that a
// user's go list -m all does not name them (docs/development.md, "Test-only
// tools in a user's module graph").
var nestedOnly = map[string]string{
	"github.com/Shopify/toxiproxy/v2":    "internal/testenv/faults",
	"github.com/rs/zerolog":              "internal/testenv/faults",
	"github.com/prometheus/prometheus":   "deploy",
	"golang.org/x/exp":                   "internal/apicheck",
	"github.com/ThreeDotsLabs/watermill": "cmd/idem-bench",
	"github.com/IBM/sarama":              "cmd/idem-bench",
}

// TestLibraryRequiresNoNestedOnlyModule fails when the library's go.mod
// requires a module that only a nested module should need: a package or a
// test of the root module imported it, and go mod tidy brought it back.
func TestLibraryRequiresNoNestedOnlyModule(t *testing.T) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if mod.Module.Path != module {
		t.Fatalf("go mod edit -json read module %q, not the library's go.mod", mod.Module.Path)
	}
	for _, r := range mod.Require {
		if home, ok := nestedOnly[r.Path]; ok {
			t.Errorf("the library's go.mod requires %s, which only %s (a module of its own) may need: import it there", r.Path, home)
		}
	}
}
