package identity_test

import (
	"fmt"

	"github.com/tollgate-dev/tollgate/shared/identity"
)

func ExampleAddress() {
	behindOneProxy := identity.Options{TrustedProxies: 1, IPv6Prefix: 64}
	fmt.Println(identity.Address("10.0.0.7:41234", "198.51.100.7", behindOneProxy))
	fmt.Println(identity.Address("[2001:db8:1:2::7]:443", "", identity.Options{IPv6Prefix: 64}))
	fmt.Println(identity.Address("10.0.0.7:41234", "not-an-address", behindOneProxy))
	// Output:
	// 198.51.100.7 false
	// 2001:db8:1:2::/64 false
	// 10.0.0.7 true
}
