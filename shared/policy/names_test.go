package policy

import (
	"regexp"
	"strings"
	"testing"
)

// The forms ValidName and ValidAttribute check, as regular expressions: the
// specification the loops are held to.
var (
	nameForm = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
	attrForm = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)
)

func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "a", "-a", "_a", ".a", "a-b_c.d", "A", "a b", "é", "a\x00", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65), "x-tenant", "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidName(s), nameForm.MatchString(s); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", s, got, want)
		}
		if got, want := ValidAttribute(s), attrForm.MatchString(s); got != want {
			t.Errorf("ValidAttribute(%q) = %v, want %v", s, got, want)
		}
	})
}
