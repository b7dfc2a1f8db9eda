package algo_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// TestManyCall checks the many entry's arguments: every request's keys in order, then
// the request count and, per request, exactly the arguments the decide entry takes for
// it alone (so each request of a batch is decided as it would be on its own), back to
// back: the library finds each request's arguments from its meter count.
func TestManyCall(t *testing.T) {
	gcra := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 10, Period: time.Second}}}
	logged := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 5, Period: time.Minute}}, Record: "user-1"}
	checks := []algo.Check{
		{Keys: []string{"k0"}, Meters: []algo.Meter{gcra}, Cost: 1},
		{Keys: []string{"k1", "k2"}, Meters: []algo.Meter{gcra, logged}, Cost: 2, NowMicros: 1_700_000_000_000_000},
		{Keys: []string{"k3"}, Meters: []algo.Meter{logged}, Cost: 0},
	}
	keys, args := algo.ManyCall(checks)
	if want := []string{"k0", "k1", "k2", "k3"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("ManyCall() keys = %v, want %v", keys, want)
	}
	if len(args) == 0 || args[0] != int64(len(checks)) {
		t.Fatalf("ManyCall() request count = %v, want %d", args[:min(1, len(args))], len(checks))
	}
	pos := 1
	for i, c := range checks {
		want := algo.DecideArgs(c.Meters, c.Cost, c.NowMicros, false)
		if len(want) != 4+2*len(c.Meters) || want[3] != int64(len(c.Meters)) {
			t.Fatalf("request %d: decide's arguments %v, want the meter count fourth and 4 + 2 per meter", i, want)
		}
		if got := args[pos:min(pos+len(want), len(args))]; !reflect.DeepEqual(got, want) {
			t.Errorf("request %d: arguments %v, want decide's %v", i, got, want)
		}
		pos += len(want)
	}
	if pos != len(args) {
		t.Errorf("ManyCall() left %d arguments over", len(args)-pos)
	}
}

// TestLibrarySource checks the two forms of the Lua: the Functions library registers
// every entry under the library's versioned name, and each entry's script calls that
// entry; both hold the same code.
func TestLibrarySource(t *testing.T) {
	lua := algo.Lua()
	if !strings.HasPrefix(lua.Name, "tollgate_") {
		t.Errorf("Lua().Name = %q, want a tollgate_ prefix", lua.Name)
	}
	src := lua.FunctionSource()
	if first, _, _ := strings.Cut(src, "\n"); first != "#!lua name="+lua.Name {
		t.Errorf("FunctionSource() starts %q, want the shebang naming %s", first, lua.Name)
	}
	for _, e := range algo.Entries {
		if reg := fmt.Sprintf("redis.register_function('%s'", lua.Function(e)); !strings.Contains(src, reg) {
			t.Errorf("FunctionSource() lacks %s", reg)
		}
		script := lua.Script(e)
		if !strings.HasSuffix(script, "return E."+string(e)+"(KEYS, ARGV)\n") {
			t.Errorf("Script(%s) does not end by calling its entry", e)
		}
		if body := strings.TrimSuffix(script, "return E."+string(e)+"(KEYS, ARGV)\n"); !strings.Contains(src, body) {
			t.Errorf("Script(%s) runs other code than the library", e)
		}
	}
}
