package wasmhost

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// status is the proxy-wasm ABI's WasmResult.
type status uint32

const (
	statusOK                  status = 0
	statusNotFound            status = 1
	statusBadArgument         status = 2
	statusInvalidMemoryAccess status = 6
	statusCasMismatch         status = 8
	statusUnimplemented       status = 12
)

// Header map and buffer types of the ABI.
const (
	mapRequestHeaders          = 0
	mapRequestTrailers         = 1
	mapResponseHeaders         = 2
	mapResponseTrailers        = 3
	mapHttpCallResponseHeaders = 6
	mapHttpCallResponseTrailer = 7

	bufferHttpCallResponseBody = 4
	bufferVMConfiguration      = 6
	bufferPluginConfiguration  = 7

	streamRequest  = 0
	streamResponse = 1
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// hostFunc is an env.proxy_* import: it reads its parameters from stack and returns
// the call's status.
type hostFunc func(vm *VM, m api.Module, stack []uint64) status

// abi lists the imports the host implements, with their parameter types.
var abi = []struct {
	name   string
	params []api.ValueType
	fn     hostFunc
}{
	{"proxy_log", []api.ValueType{i32, i32, i32}, proxyLog},
	{"proxy_get_property", []api.ValueType{i32, i32, i32, i32}, proxyGetProperty},
	{"proxy_get_header_map_pairs", []api.ValueType{i32, i32, i32}, proxyGetHeaderMapPairs},
	{"proxy_set_header_map_pairs", []api.ValueType{i32, i32, i32}, proxySetHeaderMapPairs},
	{"proxy_get_header_map_value", []api.ValueType{i32, i32, i32, i32, i32}, proxyGetHeaderMapValue},
	{"proxy_add_header_map_value", []api.ValueType{i32, i32, i32, i32, i32}, proxyAddHeaderMapValue},
	{"proxy_replace_header_map_value", []api.ValueType{i32, i32, i32, i32, i32}, proxyReplaceHeaderMapValue},
	{"proxy_remove_header_map_value", []api.ValueType{i32, i32, i32}, proxyRemoveHeaderMapValue},
	{"proxy_get_buffer_bytes", []api.ValueType{i32, i32, i32, i32, i32}, proxyGetBufferBytes},
	{"proxy_continue_stream", []api.ValueType{i32}, proxyContinueStream},
	{"proxy_close_stream", []api.ValueType{i32}, proxyCloseStream},
	{"proxy_send_local_response", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, proxySendLocalResponse},
	{"proxy_http_call", []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, proxyHttpCall},
	{"proxy_set_tick_period_milliseconds", []api.ValueType{i32}, proxySetTickPeriod},
	{"proxy_set_effective_context", []api.ValueType{i32}, proxySetEffectiveContext},
	{"proxy_done", nil, func(*VM, api.Module, []uint64) status { return statusOK }},
	{"proxy_define_metric", []api.ValueType{i32, i32, i32, i32}, proxyDefineMetric},
	{"proxy_increment_metric", []api.ValueType{i32, i64}, proxyIncrementMetric},
	{"proxy_record_metric", []api.ValueType{i32, i64}, proxyRecordMetric},
	{"proxy_get_metric", []api.ValueType{i32, i32}, proxyGetMetric},
	{"proxy_get_shared_data", []api.ValueType{i32, i32, i32, i32, i32}, proxyGetSharedData},
	{"proxy_set_shared_data", []api.ValueType{i32, i32, i32, i32, i32}, proxySetSharedData},
}

// exportABI instantiates the "env" host module. Each function finds its VM in the
// context the VM calls the guest with.
func exportABI(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder("env")
	for _, f := range abi {
		fn := f.fn
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
				vm, _ := ctx.Value(vmKey{}).(*VM)
				if vm == nil {
					stack[0] = uint64(statusBadArgument)
					return
				}
				stack[0] = uint64(fn(vm, m, stack))
			}), f.params, []api.ValueType{i32}).
			Export(f.name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("wasmhost: instantiate the proxy-wasm host functions: %w", err)
	}
	return nil
}

func u32(v uint64) uint32 { return uint32(v) }

// read copies size bytes at ptr out of the guest's memory.
func read(m api.Module, ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	b, ok := m.Memory().Read(ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

// give copies data into memory the guest allocates (proxy_on_memory_allocate) and
// writes its address and size at ptrPtr and sizePtr.
func (vm *VM) give(m api.Module, data []byte, ptrPtr, sizePtr uint32) status {
	var addr uint32
	if len(data) > 0 {
		res, err := vm.malloc.Call(vm.ctx, uint64(len(data)))
		if err != nil {
			panic(fmt.Errorf("proxy_on_memory_allocate(%d): %w", len(data), err))
		}
		addr = uint32(res[0])
		if !m.Memory().Write(addr, data) {
			return statusInvalidMemoryAccess
		}
	}
	if !m.Memory().WriteUint32Le(ptrPtr, addr) || !m.Memory().WriteUint32Le(sizePtr, uint32(len(data))) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

// encodeMap serializes headers as the ABI does: the number of pairs, the sizes of
// each key and value, then each key and value followed by a NUL.
func encodeMap(hs [][2]string) []byte {
	size := 4
	for _, h := range hs {
		size += 8 + len(h[0]) + len(h[1]) + 2
	}
	b := make([]byte, 4, size)
	binary.LittleEndian.PutUint32(b, uint32(len(hs)))
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[1])))
	}
	for _, h := range hs {
		b = append(append(b, h[0]...), 0)
		b = append(append(b, h[1]...), 0)
	}
	return b
}

// decodeMap reads a serialized header map; it reports false when b is malformed.
func decodeMap(b []byte) ([][2]string, bool) {
	if len(b) < 4 {
		return nil, len(b) == 0
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > (len(b)-4)/10 {
		return nil, false
	}
	sizes, data := b[4:4+8*n], b[4+8*n:]
	hs := make([][2]string, n)
	for i := range hs {
		for j := range 2 {
			l := int(binary.LittleEndian.Uint32(sizes[8*i+4*j:]))
			if l+1 > len(data) {
				return nil, false
			}
			hs[i][j] = string(data[:l])
			data = data[l+1:]
		}
	}
	return hs, true
}

func proxyLog(vm *VM, m api.Module, s []uint64) status {
	msg, ok := read(m, u32(s[1]), u32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	level := u32(s[0])
	if int(level) >= len(vm.logs) {
		return statusBadArgument
	}
	vm.logs[level] = append(vm.logs[level], string(msg))
	return statusOK
}

func proxyGetProperty(vm *VM, m api.Module, s []uint64) status {
	path, ok := read(m, u32(s[0]), u32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	key := strings.ReplaceAll(strings.TrimSuffix(string(path), "\x00"), "\x00", ".")
	if st, ok := vm.streams[vm.current]; ok {
		if v, ok := st.properties[key]; ok {
			return vm.give(m, v, u32(s[2]), u32(s[3]))
		}
	}
	if v, ok := vm.opts.Properties[key]; ok {
		return vm.give(m, v, u32(s[2]), u32(s[3]))
	}
	return statusNotFound
}

// headerMap returns the header map of the given type of the effective context.
func (vm *VM) headerMap(mapType uint32) (*[][2]string, status) {
	switch mapType {
	case mapHttpCallResponseHeaders, mapHttpCallResponseTrailer:
		if vm.answer == nil {
			return nil, statusNotFound
		}
		if mapType == mapHttpCallResponseHeaders {
			return &vm.answer.headers, statusOK
		}
		return &vm.answer.trailers, statusOK
	}
	st, ok := vm.streams[vm.current]
	if !ok {
		return nil, statusBadArgument
	}
	switch mapType {
	case mapRequestHeaders:
		return &st.requestHeaders, statusOK
	case mapResponseHeaders:
		return &st.responseHeaders, statusOK
	case mapResponseTrailers:
		return &st.responseTrailers, statusOK
	case mapRequestTrailers:
		var none [][2]string
		return &none, statusOK
	}
	return nil, statusBadArgument
}

func proxyGetHeaderMapPairs(vm *VM, m api.Module, s []uint64) status {
	hs, st := vm.headerMap(u32(s[0]))
	if st != statusOK {
		return st
	}
	return vm.give(m, encodeMap(*hs), u32(s[1]), u32(s[2]))
}

func proxySetHeaderMapPairs(vm *VM, m api.Module, s []uint64) status {
	hs, st := vm.headerMap(u32(s[0]))
	if st != statusOK {
		return st
	}
	b, ok := read(m, u32(s[1]), u32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	pairs, ok := decodeMap(b)
	if !ok {
		return statusBadArgument
	}
	*hs = pairs
	return statusOK
}

// keyValue reads the key and value parameters at s[1:5].
func keyValue(m api.Module, s []uint64) (key, value string, ok bool) {
	k, ok1 := read(m, u32(s[1]), u32(s[2]))
	v, ok2 := read(m, u32(s[3]), u32(s[4]))
	return string(k), string(v), ok1 && ok2
}

func proxyGetHeaderMapValue(vm *VM, m api.Module, s []uint64) status {
	hs, st := vm.headerMap(u32(s[0]))
	if st != statusOK {
		return st
	}
	key, ok := read(m, u32(s[1]), u32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	for _, h := range *hs {
		if strings.EqualFold(h[0], string(key)) {
			return vm.give(m, []byte(h[1]), u32(s[3]), u32(s[4]))
		}
	}
	return statusNotFound
}

func proxyAddHeaderMapValue(vm *VM, m api.Module, s []uint64) status {
	return setHeader(vm, m, s, false)
}

func proxyReplaceHeaderMapValue(vm *VM, m api.Module, s []uint64) status {
	return setHeader(vm, m, s, true)
}

// setHeader adds the header in s's key and value to its map, first dropping the
// key's values when replace is set.
func setHeader(vm *VM, m api.Module, s []uint64, replace bool) status {
	hs, st := vm.headerMap(u32(s[0]))
	if st != statusOK {
		return st
	}
	k, v, ok := keyValue(m, s)
	if !ok {
		return statusInvalidMemoryAccess
	}
	if replace {
		removeHeader(hs, k)
	}
	*hs = append(*hs, [2]string{k, v})
	return statusOK
}

func proxyRemoveHeaderMapValue(vm *VM, m api.Module, s []uint64) status {
	hs, st := vm.headerMap(u32(s[0]))
	if st != statusOK {
		return st
	}
	k, ok := read(m, u32(s[1]), u32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	removeHeader(hs, string(k))
	return statusOK
}

func removeHeader(hs *[][2]string, name string) {
	kept := (*hs)[:0]
	for _, h := range *hs {
		if !strings.EqualFold(h[0], name) {
			kept = append(kept, h)
		}
	}
	*hs = kept
}

func proxyGetBufferBytes(vm *VM, m api.Module, s []uint64) status {
	var buf []byte
	switch u32(s[0]) {
	case bufferHttpCallResponseBody:
		if vm.answer == nil {
			return statusNotFound
		}
		buf = vm.answer.body
	case bufferPluginConfiguration:
		buf = vm.opts.PluginConfig
	case bufferVMConfiguration:
		buf = vm.opts.VMConfig
	default:
		return statusNotFound
	}
	start, size := int64(u32(s[1])), int64(u32(s[2]))
	if start > int64(len(buf)) {
		return statusBadArgument
	}
	end := min(start+size, int64(len(buf)))
	return vm.give(m, buf[start:end], u32(s[3]), u32(s[4]))
}

func proxyContinueStream(vm *VM, _ api.Module, s []uint64) status {
	st, ok := vm.streams[vm.current]
	if !ok {
		return statusBadArgument
	}
	switch u32(s[0]) {
	case streamRequest, streamResponse:
		st.action = ActionContinue
		if vm.opts.OnStreamChange != nil {
			vm.opts.OnStreamChange(vm.current)
		}
		return statusOK
	}
	return statusBadArgument
}

func proxyCloseStream(vm *VM, _ api.Module, _ []uint64) status {
	if _, ok := vm.streams[vm.current]; !ok {
		return statusBadArgument
	}
	return statusUnimplemented
}

func proxySendLocalResponse(vm *VM, m api.Module, s []uint64) status {
	st, ok := vm.streams[vm.current]
	if !ok {
		return statusBadArgument
	}
	detail, ok1 := read(m, u32(s[1]), u32(s[2]))
	body, ok2 := read(m, u32(s[3]), u32(s[4]))
	hb, ok3 := read(m, u32(s[5]), u32(s[6]))
	if !ok1 || !ok2 || !ok3 {
		return statusInvalidMemoryAccess
	}
	hs, ok := decodeMap(hb)
	if !ok {
		return statusBadArgument
	}
	st.local = &LocalResponse{StatusCode: u32(s[0]), StatusCodeDetail: string(detail), Headers: hs, Body: body, GRPCStatus: int32(u32(s[7]))}
	if vm.opts.OnStreamChange != nil {
		vm.opts.OnStreamChange(vm.current)
	}
	return statusOK
}

func proxyHttpCall(vm *VM, m api.Module, s []uint64) status {
	upstream, ok1 := read(m, u32(s[0]), u32(s[1]))
	hb, ok2 := read(m, u32(s[2]), u32(s[3]))
	body, ok3 := read(m, u32(s[4]), u32(s[5]))
	tb, ok4 := read(m, u32(s[6]), u32(s[7]))
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return statusInvalidMemoryAccess
	}
	headers, ok1 := decodeMap(hb)
	trailers, ok2 := decodeMap(tb)
	if !ok1 || !ok2 {
		return statusBadArgument
	}
	// A callout ID is handed out again once its answer was delivered: take the lowest
	// free one. Envoy counts IDs up and repeats one only after wrap-around; repeating at
	// once is the harsher test of a filter that must route each answer to its request.
	id := uint32(1)
	for {
		if _, busy := vm.pending[id]; !busy {
			break
		}
		id++
	}
	if !m.Memory().WriteUint32Le(u32(s[9]), id) {
		return statusInvalidMemoryAccess
	}
	c := Callout{ID: id, ContextID: vm.current, Upstream: string(upstream), Headers: headers, Body: body,
		Trailers: trailers, Timeout: time.Duration(u32(s[8])) * time.Millisecond}
	vm.pending[id] = c
	if st, ok := vm.streams[vm.current]; ok {
		st.callouts = append(st.callouts, c)
	} else if vm.current == vm.rootID {
		vm.rootCallouts = append(vm.rootCallouts, c)
	}
	if vm.opts.OnHttpCall != nil {
		vm.opts.OnHttpCall(c)
	}
	return statusOK
}

func proxySetTickPeriod(vm *VM, _ api.Module, s []uint64) status {
	vm.tick = u32(s[0])
	return statusOK
}

func proxySetEffectiveContext(vm *VM, _ api.Module, s []uint64) status {
	id := u32(s[0])
	if _, ok := vm.streams[id]; !ok && id != vm.rootID {
		return statusBadArgument
	}
	vm.current = id
	return statusOK
}

func proxyDefineMetric(vm *VM, m api.Module, s []uint64) status {
	name, ok := read(m, u32(s[1]), u32(s[2]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	id := 0
	for i, mt := range vm.metrics {
		if mt.name == string(name) {
			id = i + 1
		}
	}
	if id == 0 {
		vm.metrics = append(vm.metrics, metric{name: string(name), kind: u32(s[0])})
		id = len(vm.metrics)
	}
	if !m.Memory().WriteUint32Le(u32(s[3]), uint32(id)) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func (vm *VM) metric(id uint32) *metric {
	if id == 0 || int(id) > len(vm.metrics) {
		return nil
	}
	return &vm.metrics[id-1]
}

func proxyIncrementMetric(vm *VM, _ api.Module, s []uint64) status {
	mt := vm.metric(u32(s[0]))
	if mt == nil {
		return statusNotFound
	}
	mt.value += s[1] // an int64 offset: two's complement adds a negative one too
	return statusOK
}

func proxyRecordMetric(vm *VM, _ api.Module, s []uint64) status {
	mt := vm.metric(u32(s[0]))
	if mt == nil {
		return statusNotFound
	}
	mt.value = s[1]
	return statusOK
}

func proxyGetMetric(vm *VM, m api.Module, s []uint64) status {
	mt := vm.metric(u32(s[0]))
	if mt == nil {
		return statusNotFound
	}
	if !m.Memory().WriteUint64Le(u32(s[1]), mt.value) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func proxyGetSharedData(vm *VM, m api.Module, s []uint64) status {
	key, ok := read(m, u32(s[0]), u32(s[1]))
	if !ok {
		return statusInvalidMemoryAccess
	}
	v, cas, st := vm.shared.get(string(key))
	if st != statusOK {
		return st
	}
	if st := vm.give(m, v, u32(s[2]), u32(s[3])); st != statusOK {
		return st
	}
	if !m.Memory().WriteUint32Le(u32(s[4]), cas) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func proxySetSharedData(vm *VM, m api.Module, s []uint64) status {
	key, ok1 := read(m, u32(s[0]), u32(s[1]))
	value, ok2 := read(m, u32(s[2]), u32(s[3]))
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	return vm.shared.set(string(key), value, u32(s[4]))
}
