package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// runtimeAPI is a minimal Lambda Runtime API (the documented 2018-06-01 interface:
// invocation/next, invocation/{id}/response, invocation/{id}/error, init/error) and
// the part of the Extensions API that aws-lambda-go's SIGTERM support calls
// (extension/register, extension/event/next). It hands out one event per
// invocation/next and waits for the function's answer.
type runtimeAPI struct {
	srv *httptest.Server

	events chan pending
	done   chan struct{} // closed at cleanup: blocked long polls return

	mu        sync.Mutex
	waiting   map[string]chan result // request id → where its result goes
	seq       int
	initErr   chan result
	nextCalls int
	extension bool // an extension registered (SIGTERM enabled)
}

type pending struct {
	id      string
	payload []byte
}

// result is a function's answer to one invocation, or its init error.
type result struct {
	body      []byte
	isError   bool
	errorType string // Lambda-Runtime-Function-Error-Type
}

// errorMessage returns the errorMessage of an error result.
func (r result) errorMessage() string {
	var e struct {
		ErrorMessage string `json:"errorMessage"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.ErrorMessage
}

func newRuntimeAPI(t testing.TB) *runtimeAPI {
	t.Helper()
	r := &runtimeAPI{
		events:  make(chan pending),
		done:    make(chan struct{}),
		waiting: map[string]chan result{},
		initErr: make(chan result, 1),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", r.next)
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", r.answer(false))
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", r.answer(true))
	mux.HandleFunc("POST /2018-06-01/runtime/init/error", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		select {
		case r.initErr <- result{body: body, isError: true, errorType: req.Header.Get("Lambda-Runtime-Function-Error-Type")}:
		default:
		}
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /2020-01-01/extension/register", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.extension = true
		r.mu.Unlock()
		w.Header().Set("Lambda-Extension-Identifier", "ext-1")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{}`)
	})
	mux.HandleFunc("GET /2020-01-01/extension/event/next", func(w http.ResponseWriter, req *http.Request) {
		// The internal SIGTERM extension registers for no events: its next
		// never returns while the function lives.
		select {
		case <-r.done:
		case <-req.Context().Done():
		}
	})
	r.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(r.done)
		r.srv.CloseClientConnections()
		r.srv.Close()
	})
	return r
}

// Addr is the host:port for AWS_LAMBDA_RUNTIME_API.
func (r *runtimeAPI) Addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *runtimeAPI) next(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.nextCalls++
	r.mu.Unlock()
	select {
	case ev := <-r.events:
		h := w.Header()
		h.Set("Lambda-Runtime-Aws-Request-Id", ev.id)
		h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(30*time.Second).UnixMilli(), 10))
		h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:tollgate-authorizer")
		h.Set("Lambda-Runtime-Trace-Id", "Root=1-5e66d96f-7491f09xmpl79d18acf3d050;Sampled=0")
		h.Set("Content-Type", "application/json")
		_, _ = w.Write(ev.payload)
	case <-r.done:
		http.Error(w, "shutting down", http.StatusInternalServerError)
	case <-req.Context().Done():
	}
}

func (r *runtimeAPI) answer(isError bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := req.PathValue("id")
		r.mu.Lock()
		ch, ok := r.waiting[id]
		delete(r.waiting, id)
		r.mu.Unlock()
		if !ok {
			http.Error(w, `{"errorMessage":"unknown request id"}`, http.StatusBadRequest)
			return
		}
		ch <- result{body: body, isError: isError, errorType: req.Header.Get("Lambda-Runtime-Function-Error-Type")}
		w.WriteHeader(http.StatusAccepted)
	}
}

// Invoke hands payload to the function and waits for its answer.
func (r *runtimeAPI) Invoke(ctx context.Context, payload []byte) (result, error) {
	r.mu.Lock()
	r.seq++
	id := fmt.Sprintf("req-%04d", r.seq)
	ch := make(chan result, 1)
	r.waiting[id] = ch
	r.mu.Unlock()
	select {
	case r.events <- pending{id: id, payload: payload}:
	case <-ctx.Done():
		return result{}, fmt.Errorf("runtime API: the function did not ask for invocation %s: %w", id, ctx.Err())
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return result{}, fmt.Errorf("runtime API: no answer to invocation %s: %w", id, ctx.Err())
	}
}

// InitError waits for an init error.
func (r *runtimeAPI) InitError(ctx context.Context) (result, error) {
	select {
	case res := <-r.initErr:
		return res, nil
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
}

// NextCalls returns how many times the function asked for an invocation.
func (r *runtimeAPI) NextCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nextCalls
}

// ExtensionRegistered reports whether the function registered its SIGTERM extension.
func (r *runtimeAPI) ExtensionRegistered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.extension
}
