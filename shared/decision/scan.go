package decision

// scanCheckRequest decodes body when it is a plain /v1/check object, as callers send
// it:
//
//	{"domain": "api", "attributes": {"api_key": "k1", "path": "/v1"}, "cost": 1}
//
// with each key at most once, in any order, JSON whitespace anywhere between tokens,
// strings without escapes, and a cost of at most 18 digits without a fraction or
// exponent. It reports false for every other body (a key in another case or
// unknown, a key twice, an escape, a null or a value of another type, anything after
// the object, malformed JSON), which encoding/json must then decode, so that its
// error messages stay the answer's. When it reports true the fields are the ones
// decodeCheckRequest returns for body.
//
// The body must be valid UTF-8 (parseCheckRequest checks it first). Every string is
// copied out of body, so body may be reused afterwards.
func scanCheckRequest(body []byte) (cf checkFields, ok bool) {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return checkFields{}, false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return cf, skipSpace(body, i+1) == len(body)
	}
	var seen uint8 // 1 domain, 2 attributes, 4 cost
	for {
		key, j, ok := scanString(body, i)
		if !ok {
			return checkFields{}, false
		}
		i = skipSpace(body, j)
		if i == len(body) || body[i] != ':' {
			return checkFields{}, false
		}
		i = skipSpace(body, i+1)
		var bit uint8
		switch string(key) {
		case "domain":
			bit = 1
			var v []byte
			if v, i, ok = scanString(body, i); ok {
				cf.domain = string(v)
			}
		case "attributes":
			bit = 2
			cf.attrs, i, ok = scanAttributes(body, i)
		case "cost":
			bit = 4
			cf.cost, i, ok = scanInt(body, i)
			cf.hasCost = true
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return checkFields{}, false
		}
		seen |= bit
		i = skipSpace(body, i)
		if i == len(body) {
			return checkFields{}, false
		}
		if body[i] == '}' {
			return cf, skipSpace(body, i+1) == len(body)
		}
		if body[i] != ',' {
			return checkFields{}, false
		}
		i = skipSpace(body, i+1)
	}
}

// scanAttributes scans the object of strings at body[i:] into a new map and returns
// the index after it. A key given twice keeps its last value, as in encoding/json.
func scanAttributes(body []byte, i int) (map[string]string, int, bool) {
	if i == len(body) || body[i] != '{' {
		return nil, i, false
	}
	attrs := make(map[string]string)
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return attrs, i + 1, true
	}
	for {
		k, j, ok := scanString(body, i)
		if !ok {
			return nil, i, false
		}
		i = skipSpace(body, j)
		if i == len(body) || body[i] != ':' {
			return nil, i, false
		}
		v, j, ok := scanString(body, skipSpace(body, i+1))
		if !ok {
			return nil, i, false
		}
		attrs[string(k)] = string(v)
		i = skipSpace(body, j)
		if i == len(body) {
			return nil, i, false
		}
		if body[i] == '}' {
			return attrs, i + 1, true
		}
		if body[i] != ',' {
			return nil, i, false
		}
		i = skipSpace(body, i+1)
	}
}

// scanString scans the string at body[i:] and returns its contents, a subslice of
// body, and the index after its closing quote. It fails on an escape or a control
// character, which encoding/json either decodes or rejects.
func scanString(body []byte, i int) ([]byte, int, bool) {
	if i == len(body) || body[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(body); j++ {
		switch c := body[j]; {
		case c == '"':
			return body[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, j, false
		}
	}
	return nil, len(body), false
}

// maxIntDigits is the most digits scanInt takes: every 18-digit number fits in an
// int64.
const maxIntDigits = 18

// scanInt scans the integer at body[i:]: an optional minus sign and 1 to
// maxIntDigits digits without a leading zero, or a lone 0. A fraction or exponent
// after it is left for the caller to reject.
func scanInt(body []byte, i int) (int64, int, bool) {
	neg := i < len(body) && body[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(body) && body[i] >= '0' && body[i] <= '9' {
		n = n*10 + int64(body[i]-'0')
		i++
	}
	switch digits := i - start; {
	case digits == 0, digits > maxIntDigits:
		return 0, i, false
	case body[start] == '0' && (digits > 1 || neg): // 01 is malformed; -0 left to encoding/json
		return 0, i, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}

// skipSpace returns the index of the first byte at or after i that is not JSON
// whitespace.
func skipSpace(body []byte, i int) int {
	for i < len(body) {
		switch body[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}
