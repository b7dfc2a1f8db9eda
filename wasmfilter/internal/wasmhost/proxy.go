package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	// VM configures the plugin's VM; its OnHttpCall and OnStreamChange are the
	// proxy's own and must be nil. A nil Clock is the system clock.
	VM Options
	// Upstream is the base URL allowed requests are forwarded to, e.g.
	// "http://127.0.0.1:8081".
	Upstream string
	// Clusters maps the Envoy clusters the plugin calls out to onto base URLs. A
	// callout to a cluster not listed is answered 503 "no healthy upstream".
	Clusters map[string]string
	// Client sends the callouts and the forwarded requests; nil means a client of
	// the proxy's own.
	Client *http.Client
}

// Proxy plays Envoy around one VM over real sockets: as an http.Handler it runs each
// request through the plugin, forwards the ones the plugin lets through to the
// upstream and passes the response back through the plugin; it sends the plugin's
// callouts over HTTP to the clusters and answers them as Envoy does (503 when it cannot
// connect, 504 past the callout's timeout); and it runs the plugin's tick on the wall
// clock. Requests are decided one at a time, as on one Envoy worker.
type Proxy struct {
	vm       *VM
	upstream string
	clusters map[string]string
	client   *http.Client
	callouts atomic.Int64

	mu      sync.Mutex
	waiters map[uint32]chan struct{}
	err     error // the first failure of the VM

	stop chan struct{}
	done chan struct{}
}

// NewProxy instantiates a VM of rt, starts the plugin and its tick loop. Close it.
func NewProxy(ctx context.Context, rt *Runtime, cfg ProxyConfig) (*Proxy, error) {
	if cfg.Upstream == "" {
		return nil, errors.New(`wasmhost: ProxyConfig.Upstream is empty; set the base URL of the upstream, e.g. "http://127.0.0.1:8081"`)
	}
	if cfg.VM.OnHttpCall != nil || cfg.VM.OnStreamChange != nil {
		return nil, errors.New("wasmhost: ProxyConfig.VM: OnHttpCall and OnStreamChange are the proxy's; leave them nil")
	}
	p := &Proxy{upstream: strings.TrimSuffix(cfg.Upstream, "/"), clusters: cfg.Clusters, client: cfg.Client,
		waiters: map[uint32]chan struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	if p.client == nil {
		p.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	}
	opts := cfg.VM
	opts.OnHttpCall = func(c Callout) {
		p.callouts.Add(1)
		go p.send(c)
	}
	opts.OnStreamChange = p.wake
	vm, err := rt.NewVM(ctx, opts)
	if err != nil {
		return nil, err
	}
	p.vm = vm // before the start, which may already call out
	ok, err := vm.StartPlugin()
	if err != nil || !ok {
		vm.Close(ctx)
		if err == nil {
			err = fmt.Errorf("wasmhost: the plugin refused its configuration: %s", strings.Join(vm.Logs(LogCritical), "; "))
		}
		return nil, err
	}
	go p.tickLoop()
	return p, nil
}

// VM returns the proxy's VM, e.g. to read its metrics.
func (p *Proxy) VM() *VM { return p.vm }

// Callouts returns how many callouts the plugin dispatched.
func (p *Proxy) Callouts() int64 { return p.callouts.Load() }

// Err returns the first error of the VM (a trap), or nil.
func (p *Proxy) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close stops the tick loop and releases the VM.
func (p *Proxy) Close() error {
	close(p.stop)
	<-p.done
	return p.vm.Close(context.Background())
}

// fail records the VM's first failure and wakes every waiting request.
func (p *Proxy) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	for _, ch := range p.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wake signals the request of a stream the plugin continued or answered. The VM is
// locked: it only signals.
func (p *Proxy) wake(id uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.waiters[id]; ok {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// tickLoop calls proxy_on_tick at the period the plugin set, on the wall clock.
func (p *Proxy) tickLoop() {
	defer close(p.done)
	const idle = 2 * time.Millisecond // how often a stopped tick is checked
	last := time.Now()
	for {
		period := time.Duration(p.vm.TickPeriod()) * time.Millisecond
		wait := idle
		if period > 0 {
			wait = max(time.Until(last.Add(period)), 0)
		}
		select {
		case <-p.stop:
			return
		case <-time.After(wait):
		}
		if period == 0 || time.Since(last) < period {
			if period == 0 {
				last = time.Now()
			}
			continue
		}
		last = time.Now()
		if err := p.vm.Tick(); err != nil {
			p.fail(err)
			return
		}
	}
}

// send makes a callout over HTTP and delivers the answer to the plugin.
func (p *Proxy) send(c Callout) {
	headers, body := p.roundTrip(c)
	if err := p.vm.RespondCallout(c.ID, headers, nil, body); err != nil {
		p.fail(err)
	}
}

// roundTrip answers a callout as Envoy would: the cluster's response, or Envoy's own
// 503 (no such cluster, cannot connect) or 504 (timeout).
func (p *Proxy) roundTrip(c Callout) ([][2]string, []byte) {
	base, ok := p.clusters[c.Upstream]
	if !ok {
		return [][2]string{{":status", "503"}, {"content-type", "text/plain"}}, []byte("no healthy upstream")
	}
	return Forward(p.client, base, c)
}

// Forward sends callout c over HTTP to base (a URL without a path) with client, and
// returns the answer as Envoy hands it to a plugin: the response's status and headers,
// or Envoy's own 503 (cannot connect) or 504 (past c.Timeout, when set), and the body.
func Forward(client *http.Client, base string, c Callout) ([][2]string, []byte) {
	method, _ := lookup(c.Headers, ":method")
	path, _ := lookup(c.Headers, ":path")
	ctx := context.Background()
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(c.Body))
	if err != nil {
		return [][2]string{{":status", "503"}, {"content-type", "text/plain"}}, []byte("invalid callout: " + err.Error())
	}
	copyHeaders(req, c.Headers)
	resp, err := client.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			return responseHeaders(resp), b
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return [][2]string{{":status", "504"}, {"content-type", "text/plain"}}, []byte("upstream request timeout")
	}
	return [][2]string{{":status", "503"}, {"content-type", "text/plain"}},
		[]byte("upstream connect error or disconnect/reset before headers. reset reason: connection failure")
}

// ServeHTTP runs a request through the plugin.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := p.Err(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	id, err := p.vm.NewHttpContext(map[string][]byte{"source.address": []byte(r.RemoteAddr)})
	if err != nil {
		p.fail(err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.waiters[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiters, id)
		p.mu.Unlock()
		if err := p.vm.CompleteHttpContext(id); err != nil {
			p.fail(err)
		}
	}()

	headers := [][2]string{{":method", r.Method}, {":path", r.URL.RequestURI()}, {":authority", r.Host}, {":scheme", "http"}}
	for name, values := range r.Header {
		for _, v := range values {
			headers = append(headers, [2]string{strings.ToLower(name), v})
		}
	}
	endOfStream := r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
	if _, err := p.vm.RequestHeaders(id, headers, endOfStream); err != nil {
		p.fail(err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	for {
		if err := p.Err(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if lr := p.vm.LocalResponseOf(id); lr != nil {
			p.reply(w, id, lr)
			return
		}
		if p.vm.StreamAction(id) == ActionContinue {
			p.forward(w, r, id)
			return
		}
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
	}
}

// reply writes the plugin's local response, after passing its headers through the
// plugin's response callback as Envoy does.
func (p *Proxy) reply(w http.ResponseWriter, id uint32, lr *LocalResponse) {
	headers := append([][2]string{{":status", strconv.Itoa(int(lr.StatusCode))}}, lr.Headers...)
	if _, err := p.vm.ResponseHeaders(id, headers, len(lr.Body) == 0); err != nil {
		p.fail(err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeHeaders(w, p.vm.ResponseHeadersOf(id), int(lr.StatusCode))
	w.Write(lr.Body)
}

// forward sends the request upstream and the response back through the plugin.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, id uint32) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	copyHeaders(req, p.vm.RequestHeadersOf(id))
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, "upstream connect error: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	if _, err := p.vm.ResponseHeaders(id, responseHeaders(resp), false); err != nil {
		p.fail(err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// Trailers the upstream declares are declared to the client, so that the
	// response is chunked and can carry them.
	for name := range resp.Trailer {
		w.Header().Add("Trailer", name)
	}
	writeHeaders(w, p.vm.ResponseHeadersOf(id), resp.StatusCode)
	io.Copy(w, resp.Body)
	// The trailers, known once the body is read, go through the plugin too.
	if len(resp.Trailer) > 0 {
		var ts [][2]string
		for name, values := range resp.Trailer {
			for _, v := range values {
				ts = append(ts, [2]string{strings.ToLower(name), v})
			}
		}
		if _, err := p.vm.ResponseTrailers(id, ts); err != nil {
			p.fail(err)
			return
		}
		for _, t := range ts {
			w.Header().Add(http.TrailerPrefix+t[0], t[1])
		}
	}
}

// copyHeaders sets the regular (not pseudo) headers of hs on req.
func copyHeaders(req *http.Request, hs [][2]string) {
	for _, h := range hs {
		switch {
		case strings.HasPrefix(h[0], ":"):
		case strings.EqualFold(h[0], "host"):
			req.Host = h[1]
		case strings.EqualFold(h[0], "content-length"):
		default:
			req.Header.Add(h[0], h[1])
		}
	}
}

// responseHeaders returns resp's status and headers as Envoy hands them to a plugin:
// ":status" first, names in lower case.
func responseHeaders(resp *http.Response) [][2]string {
	hs := [][2]string{{":status", strconv.Itoa(resp.StatusCode)}}
	for name, values := range resp.Header {
		for _, v := range values {
			hs = append(hs, [2]string{strings.ToLower(name), v})
		}
	}
	return hs
}

// writeHeaders writes hs (less the pseudo headers) and the status.
func writeHeaders(w http.ResponseWriter, hs [][2]string, status int) {
	for _, h := range hs {
		if !strings.HasPrefix(h[0], ":") && !strings.EqualFold(h[0], "content-length") {
			w.Header().Add(h[0], h[1])
		}
	}
	w.WriteHeader(status)
}

func lookup(hs [][2]string, name string) (string, bool) {
	for _, h := range hs {
		if strings.EqualFold(h[0], name) {
			return h[1], true
		}
	}
	return "", false
}
