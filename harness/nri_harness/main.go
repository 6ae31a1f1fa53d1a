// nri-harness plays the container runtime for NRI plugin tests, using containerd/nri's own
// runtime adaptation package (github.com/containerd/nri/pkg/adaptation, what containerd embeds).
//
// It listens on -socket, accepts external plugins, and executes one JSON command per stdin
// line, answering one JSON line on stdout:
//
//	{"op":"wait-sync","count":1,"timeout":10}    wait until N plugin Synchronize calls happened
//	{"op":"set-pods","pods":[<PodSandbox>...]}    pods the next Synchronize reports
//	{"op":"run","pod":<PodSandbox>}               RunPodSandbox (pod joins the Synchronize list)
//	{"op":"create","pod":<PodSandbox>,"container":<Container>}  CreateContainer -> "adjust"
//	{"op":"stop","pod":<PodSandbox>}              StopPodSandbox
//	{"op":"remove","pod":<PodSandbox>}            RemovePodSandbox (pod leaves the list)
//	{"op":"noop","pod":<PodSandbox>}              RunPodSandbox timed N times ("count"): round trips
//	{"op":"run-all","pods":[<PodSandbox>...]}     RunPodSandbox of every pod at once (pods started
//	                                              together: the adaptation serializes them as in
//	                                              containerd); "seconds": each one's, from the start
//	{"op":"stop-all","pods":[<PodSandbox>...]}    StopPodSandbox of every pod at once, likewise
//
// PodSandbox/Container are protojson of nri.pkg.api.v1alpha1 messages. Answers are
// {"ok":true,...} or {"ok":false,"error":"..."}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/encoding/protojson"
)

type command struct {
	Op        string            `json:"op"`
	Pod       json.RawMessage   `json:"pod"`
	Pods      []json.RawMessage `json:"pods"`
	Container json.RawMessage   `json:"container"`
	Count     int               `json:"count"`
	Timeout   float64           `json:"timeout"`
}

type harness struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pods    map[string]*api.PodSandbox
	order   []string
	syncs   int
	runtime *adaptation.Adaptation
}

func (h *harness) podList() []*api.PodSandbox {
	out := []*api.PodSandbox{}
	for _, id := range h.order {
		if p, ok := h.pods[id]; ok {
			out = append(out, p)
		}
	}
	return out
}

func (h *harness) sync(ctx context.Context, cb adaptation.SyncCB) error {
	h.mu.Lock()
	pods := h.podList()
	h.mu.Unlock()
	_, err := cb(ctx, pods, []*api.Container{})
	h.mu.Lock()
	h.syncs++
	h.cond.Broadcast()
	h.mu.Unlock()
	return err
}

func (h *harness) update(ctx context.Context, _ []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

func (h *harness) addPod(p *api.PodSandbox) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.pods[p.Id]; !ok {
		h.order = append(h.order, p.Id)
	}
	h.pods[p.Id] = p
}

func parsePod(raw json.RawMessage) (*api.PodSandbox, error) {
	p := &api.PodSandbox{}
	if len(raw) == 0 {
		return nil, fmt.Errorf("missing pod")
	}
	return p, protojson.Unmarshal(raw, p)
}

func (h *harness) do(c command) (map[string]any, error) {
	ctx := context.Background()
	switch c.Op {
	case "wait-sync":
		deadline := time.Now().Add(time.Duration(c.Timeout * float64(time.Second)))
		go func() { time.Sleep(time.Until(deadline)); h.cond.Broadcast() }()
		h.mu.Lock()
		defer h.mu.Unlock()
		for h.syncs < c.Count && time.Now().Before(deadline) {
			h.cond.Wait()
		}
		if h.syncs < c.Count {
			return nil, fmt.Errorf("only %d synchronizations after %.1fs", h.syncs, c.Timeout)
		}
		syncs := h.syncs
		h.mu.Unlock()
		// The adaptation adds the plugin to its list only after the sync callback returns;
		// BlockPluginSync waits for that (it takes the sync lock the accept loop holds).
		h.runtime.BlockPluginSync().Unblock()
		h.mu.Lock()
		return map[string]any{"syncs": syncs}, nil
	case "set-pods":
		h.mu.Lock()
		h.pods, h.order = map[string]*api.PodSandbox{}, nil
		h.mu.Unlock()
		for _, raw := range c.Pods {
			p, err := parsePod(raw)
			if err != nil {
				return nil, err
			}
			h.addPod(p)
		}
		return map[string]any{}, nil
	}
	if c.Op == "run-all" || c.Op == "stop-all" {
		return h.together(ctx, c)
	}
	pod, err := parsePod(c.Pod)
	if err != nil {
		return nil, err
	}
	switch c.Op {
	case "run":
		h.addPod(pod)
		start := time.Now()
		err := h.runtime.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod})
		return map[string]any{"seconds": time.Since(start).Seconds()}, err
	case "noop":
		durations := []float64{}
		for i := 0; i < c.Count; i++ {
			start := time.Now()
			if err := h.runtime.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
				return nil, err
			}
			durations = append(durations, time.Since(start).Seconds())
		}
		return map[string]any{"seconds": durations}, nil
	case "create":
		ctr := &api.Container{}
		if len(c.Container) > 0 {
			if err := protojson.Unmarshal(c.Container, ctr); err != nil {
				return nil, err
			}
		}
		if ctr.PodSandboxId == "" {
			ctr.PodSandboxId = pod.Id
		}
		rpl, err := h.runtime.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
		if err != nil {
			return nil, err
		}
		adjust := json.RawMessage("{}")
		if rpl != nil && rpl.Adjust != nil {
			b, err := protojson.Marshal(rpl.Adjust)
			if err != nil {
				return nil, err
			}
			adjust = b
		}
		return map[string]any{"adjust": adjust}, nil
	case "stop":
		start := time.Now()
		err := h.runtime.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
		return map[string]any{"seconds": time.Since(start).Seconds()}, err
	case "remove":
		err := h.runtime.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
		h.mu.Lock()
		delete(h.pods, pod.Id)
		h.mu.Unlock()
		return map[string]any{}, err
	}
	return nil, fmt.Errorf("unknown op %q", c.Op)
}

// together runs RunPodSandbox (or StopPodSandbox) of every pod of c.Pods at once, each in its
// own goroutine as containerd's CRI server does for pods the kubelet starts together; "seconds"
// is, per pod in order, the time from the common start to its answer.
func (h *harness) together(ctx context.Context, c command) (map[string]any, error) {
	pods := make([]*api.PodSandbox, len(c.Pods))
	for i, raw := range c.Pods {
		p, err := parsePod(raw)
		if err != nil {
			return nil, err
		}
		pods[i] = p
		if c.Op == "run-all" {
			h.addPod(p)
		}
	}
	seconds := make([]float64, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range pods {
		wg.Add(1)
		go func(i int, p *api.PodSandbox) {
			defer wg.Done()
			if c.Op == "run-all" {
				errs[i] = h.runtime.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: p})
			} else {
				errs[i] = h.runtime.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: p})
			}
			seconds[i] = time.Since(start).Seconds()
		}(i, p)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", pods[i].Name, err)
		}
	}
	return map[string]any{"seconds": seconds}, nil
}

func main() {
	socket := flag.String("socket", "", "NRI socket path to listen on")
	pluginDir := flag.String("plugin-dir", "", "directory of pre-installed plugins (empty dir)")
	requestTimeout := flag.Duration("request-timeout", 2*time.Second, "time a plugin gets for one call (the runtimes' default)")
	flag.Parse()
	if *socket == "" || *pluginDir == "" {
		fmt.Fprintln(os.Stderr, "usage: nri-harness -socket PATH -plugin-dir DIR")
		os.Exit(2)
	}
	adaptation.SetPluginRequestTimeout(*requestTimeout)
	h := &harness{pods: map[string]*api.PodSandbox{}}
	h.cond = sync.NewCond(&h.mu)
	r, err := adaptation.New("nri-harness", "v0", h.sync, h.update,
		adaptation.WithSocketPath(*socket),
		adaptation.WithPluginPath(*pluginDir),
		adaptation.WithPluginConfigPath(*pluginDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h.runtime = r
	if err := r.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer r.Stop()
	// Start() already ran the sync callback once for pre-installed plugins (none): count
	// only the synchronizations of connecting external plugins.
	h.mu.Lock()
	h.syncs = 0
	h.mu.Unlock()
	out := json.NewEncoder(os.Stdout)
	out.Encode(map[string]any{"ok": true, "ready": *socket})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var c command
		var res map[string]any
		err := json.Unmarshal(in.Bytes(), &c)
		if err == nil {
			res, err = h.do(c)
		}
		if res == nil {
			res = map[string]any{}
		}
		res["ok"] = err == nil
		if err != nil {
			res["error"] = err.Error()
		}
		out.Encode(res)
	}
}
