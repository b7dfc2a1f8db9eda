package bounds_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/bounds"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprint("a", i)] = "v"
		}
		return m
	}
	long := strings.Repeat("x", bounds.MaxValueLength+1)
	tests := []struct {
		name      string
		attrs     map[string]string
		cost      int64
		field, in string
	}{
		{"at the bounds", many(bounds.MaxAttributes), bounds.MaxCost, "", ""},
		{"value at the bound", map[string]string{"k": long[1:]}, 0, "", ""},
		{"negative cost", nil, -1, "cost", "cost must be from 0 to 1048576"},
		{"cost past the bound", nil, bounds.MaxCost + 1, "cost", "cost must be from 0 to 1048576"},
		{"too many attributes", many(bounds.MaxAttributes + 1), 1, "attributes", "65 attributes; at most 64"},
		{"long value", map[string]string{"k": long}, 1, "attributes.k", "value longer than 1024 bytes"},
		{"long name", map[string]string{long: "v"}, 1, "attributes." + long[:64], "value longer than 1024 bytes"},
		{"invalid UTF-8", map[string]string{"k": "\xff"}, 1, `attributes."k"`, "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := bounds.Check(tt.attrs, tt.cost)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Field != tt.field || !strings.Contains(err.Msg, tt.in) {
				t.Fatalf("Check = %#v, want field %q and a message with %q", err, tt.field, tt.in)
			}
		})
	}
}
