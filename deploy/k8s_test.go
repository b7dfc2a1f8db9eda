package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The chart, and where the tests install it: the release name and namespace that
// the examples under examples/ assume.
const (
	chartDir         = "helm/tollgate"
	releaseName      = "tollgate"
	releaseNamespace = "tollgate"
	// kubeVersion is the cluster the chart is rendered for (Helm's library would
	// otherwise assume v1.20, older than the chart's kubeVersion allows).
	kubeVersion = "v1.33.0"
)

// valueSets are the values the chart is linted and rendered with: its defaults,
// every optional feature on (the chart's ci/ file, as chart-testing reads it), and
// the Istio example's.
var valueSets = []struct {
	name string
	file string // empty: the defaults
}{
	{"defaults", ""},
	{"all features", "helm/tollgate/ci/all-features-values.yaml"},
	{"istio example", "examples/istio/values.yaml"},
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	vals, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatalf("ReadValuesFile(%s) = %v", file, err)
	}
	return vals
}

// TestChartLint runs helm lint (the library behind the command) with each value
// set: any warning or error fails the test.
func TestChartLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			vals := readValues(t, vs.file)
			kv, err := chartutil.ParseKubeVersion(kubeVersion)
			if err != nil {
				t.Fatal(err)
			}
			linter := lint.AllWithKubeVersion(chartDir, vals, releaseNamespace, kv)
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}

// render is helm template: a client-only dry-run install of the chart with vals.
func render(t *testing.T, vals map[string]any) string {
	t.Helper()
	manifest, err := renderErr(vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return manifest
}

func renderErr(vals map[string]any) (string, error) {
	return renderChart(vals, false)
}

// renderChart renders the chart; skipSchema skips values.schema.json, as
// helm template --skip-schema-validation does, to reach the templates' own checks.
func renderChart(vals map[string]any, skipSchema bool) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.KubeVersion = kv
	install.SkipSchemaValidation = skipSchema
	install.ClientOnly = true
	install.DryRun = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = releaseName
	install.Namespace = releaseNamespace
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) that the chart writes, field for field as the
// operator's CRD names them, so that a strict decode catches a misspelt one.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// objects is a rendered release, decoded: one typed value per object.
type objects struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors []*serviceMonitor
}

// decodeManifest splits a rendered release into its objects and decodes each
// strictly (a field the type does not have, or a key given twice, is an error) into
// the k8s.io/api type of its apiVersion and kind, or, for the Prometheus Operator's
// ServiceMonitor, which k8s.io/api does not have, into serviceMonitor, a struct
// written here with the fields the chart sets. A kind the tests do not know is an
// error too, so that nothing the chart renders goes unchecked.
func decodeManifest(manifest string) (objects, error) {
	var out objects
	docs := releaseutil.SplitManifests(manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	for _, k := range keys {
		doc := docs[k]
		source := firstLine(doc)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return out, fmt.Errorf("%s: %w", source, err)
		}
		var err error
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/Deployment":
			out.deployments, err = appendStrict(out.deployments, doc)
		case "v1/Service":
			out.services, err = appendStrict(out.services, doc)
		case "v1/ConfigMap":
			out.configMaps, err = appendStrict(out.configMaps, doc)
		case "v1/ServiceAccount":
			out.serviceAccounts, err = appendStrict(out.serviceAccounts, doc)
		case "policy/v1/PodDisruptionBudget":
			out.pdbs, err = appendStrict(out.pdbs, doc)
		case "autoscaling/v2/HorizontalPodAutoscaler":
			out.hpas, err = appendStrict(out.hpas, doc)
		case "monitoring.coreos.com/v1/ServiceMonitor":
			out.serviceMonitors, err = appendStrict(out.serviceMonitors, doc)
		default:
			err = fmt.Errorf("apiVersion %q kind %q: no type to decode it into (add one to decodeManifest)", tm.APIVersion, tm.Kind)
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", source, err)
		}
	}
	return out, nil
}

func appendStrict[T any](list []*T, doc string) ([]*T, error) {
	v := new(T)
	if err := unmarshalStrict([]byte(doc), v); err != nil {
		return list, err
	}
	return append(list, v), nil
}

// unmarshalStrict decodes YAML as the Kubernetes API server reads JSON: field names
// match case-sensitively (encoding/json would take targetport for targetPort), and
// a field the type does not have, or a key given twice, is an error.
func unmarshalStrict(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// firstLine names a rendered document by helm's "# Source: ..." comment.
func firstLine(doc string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(doc), "\n")
	return line
}

// TestChartRenders renders the chart with each value set, decodes every object
// strictly, and checks what the chart promises: ERL's environment and ports, the
// config directory where ERL reads it, the probes, a non-root read-only container,
// the Service's port names for Istio, the disruption budget.
func TestChartRenders(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			vals := readValues(t, vs.file)
			objs, err := decodeManifest(render(t, vals))
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.deployments) != 1 || len(objs.services) != 1 {
				t.Fatalf("rendered %d Deployments and %d Services, want 1 and 1", len(objs.deployments), len(objs.services))
			}
			d := objs.deployments[0]
			checkDeployment(t, d)
			checkService(t, objs.services[0], d)

			env := containerEnv(d.Spec.Template.Spec.Containers[0])
			mounts := map[string]string{}
			for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			volumes := map[string]corev1.Volume{}
			for _, v := range d.Spec.Template.Spec.Volumes {
				volumes[v.Name] = v
			}
			// ERL reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config; the ConfigMap is there.
			wantDir := env["RUNTIME_ROOT"] + "/" + env["RUNTIME_SUBDIRECTORY"] + "/config"
			if got := mounts["erl-config"]; got != wantDir || wantDir != "/data/ratelimit/config" {
				t.Errorf("erl-config mounted at %q, RUNTIME_* name %q; want both /data/ratelimit/config", got, wantDir)
			}
			cm := volumes["erl-config"].ConfigMap
			if cm == nil {
				t.Fatalf("volume erl-config = %+v, want a ConfigMap", volumes["erl-config"])
			}
			switch vs.name {
			case "istio example":
				if cm.Name != "ratelimit-config" {
					t.Errorf("erl-config ConfigMap = %q, want the existing ratelimit-config", cm.Name)
				}
				if len(objs.configMaps) != 0 {
					t.Errorf("rendered %d ConfigMaps, want none (the existing one is used)", len(objs.configMaps))
				}
			default:
				if !slices.ContainsFunc(objs.configMaps, func(c *corev1.ConfigMap) bool { return c.Name == cm.Name && c.Data["config.yaml"] != "" }) {
					t.Errorf("no rendered ConfigMap %s with config.yaml", cm.Name)
				}
			}

			switch vs.name {
			case "all features":
				if d.Spec.Replicas != nil {
					t.Errorf("with autoscaling, replicas = %d, want unset (the HPA owns it)", *d.Spec.Replicas)
				}
				if len(objs.hpas) != 1 || objs.hpas[0].Spec.ScaleTargetRef.Name != d.Name || objs.hpas[0].Spec.MaxReplicas != 12 {
					t.Errorf("HPAs = %+v, want one scaling %s up to 12", objs.hpas, d.Name)
				}
				if len(objs.serviceMonitors) != 1 || objs.serviceMonitors[0].Spec.Endpoints[0].Port != "http" ||
					objs.serviceMonitors[0].Metadata.Labels["release"] != "prometheus" {
					t.Errorf("ServiceMonitors = %+v, want one scraping the http port, labelled release=prometheus", objs.serviceMonitors)
				}
				if env["REDIS_TYPE"] != "sentinel" || env["REDIS_TLS"] != "true" || env["REDIS_POOL_SIZE"] != "20" {
					t.Errorf("REDIS_TYPE, REDIS_TLS, REDIS_POOL_SIZE = %q, %q, %q; want sentinel, true, 20", env["REDIS_TYPE"], env["REDIS_TLS"], env["REDIS_POOL_SIZE"])
				}
				auth := envVar(d.Spec.Template.Spec.Containers[0], "REDIS_AUTH")
				if auth == nil || auth.ValueFrom == nil || auth.ValueFrom.SecretKeyRef == nil ||
					auth.ValueFrom.SecretKeyRef.Name != "redis-auth" || auth.ValueFrom.SecretKeyRef.Key != "password" {
					t.Errorf("REDIS_AUTH = %+v, want from Secret redis-auth, key password", auth)
				}
				if env["TOLLGATE_POLICY"] != mounts["policy"]+"/policy.yaml" {
					t.Errorf("TOLLGATE_POLICY = %q, policy mounted at %q", env["TOLLGATE_POLICY"], mounts["policy"])
				}
				if !strings.Contains(d.Spec.Template.Spec.Containers[0].Image, "@sha256:") {
					t.Errorf("image = %q, want pinned by digest", d.Spec.Template.Spec.Containers[0].Image)
				}
				if len(objs.pdbs) != 1 || objs.pdbs[0].Spec.MaxUnavailable == nil || objs.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 || objs.pdbs[0].Spec.MinAvailable != nil {
					t.Errorf("PDBs = %+v, want maxUnavailable 1 only", objs.pdbs)
				}
			default:
				if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
					t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
				}
				if len(objs.hpas) != 0 || len(objs.serviceMonitors) != 0 {
					t.Errorf("rendered %d HPAs and %d ServiceMonitors, want none by default", len(objs.hpas), len(objs.serviceMonitors))
				}
				if _, ok := env["REDIS_AUTH"]; ok {
					t.Error("REDIS_AUTH is set without redis.auth.existingSecret")
				}
				if len(objs.pdbs) != 1 || objs.pdbs[0].Spec.MinAvailable == nil || objs.pdbs[0].Spec.MinAvailable.IntValue() != 1 {
					t.Errorf("PDBs = %+v, want minAvailable 1", objs.pdbs)
				}
			}
			for _, p := range objs.pdbs {
				sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
				if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("PDB selector %v does not select the pods (%v)", p.Spec.Selector, d.Spec.Template.Labels)
				}
			}
		})
	}
}

func containerEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

func envVar(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	env := containerEnv(c)
	for k, want := range map[string]string{
		"PORT": "8080", "GRPC_PORT": "8081", "DEBUG_PORT": "6070",
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
		"RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"REDIS_SOCKET_TYPE": "tcp", "USE_STATSD": "false",
	} {
		if env[k] != want {
			t.Errorf("env %s = %q, want %q", k, env[k], want)
		}
	}
	if env["REDIS_URL"] == "" || strings.Contains(env["REDIS_URL"], "://") {
		t.Errorf("REDIS_URL = %q, want host:port as ERL reads it", env["REDIS_URL"])
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["grpc"] != 8081 || ports["debug"] != 6070 {
		t.Errorf("container ports = %v, want http 8080, grpc 8081, debug 6070", ports)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthcheck" || p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe = %+v, want GET /healthcheck on port http", name, p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want a CPU request and a memory limit", c.Resources)
	}
	sc, psc := c.SecurityContext, spec.SecurityContext
	if sc == nil || psc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("securityContext = %+v, pod %+v; want non-root 65532, read-only root, no privilege escalation, capabilities dropped", sc, psc)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Deployment selector %v does not select its pods (%v)", d.Spec.Selector, d.Spec.Template.Labels)
	}
}

func checkService(t *testing.T, s *corev1.Service, d *appsv1.Deployment) {
	t.Helper()
	if s.Name != releaseName {
		t.Errorf("Service name = %q, want %q (the examples point Envoy at it)", s.Name, releaseName)
	}
	got := map[string]corev1.ServicePort{}
	for _, p := range s.Spec.Ports {
		got[p.Name] = p
	}
	for name, port := range map[string]int32{"grpc": 8081, "http": 8080} {
		p, ok := got[name]
		// Istio selects the protocol from the port's name (or appProtocol).
		if !ok || p.Port != port || p.TargetPort.String() != name || p.AppProtocol == nil || *p.AppProtocol != name {
			t.Errorf("Service port %s = %+v, want port %d, targetPort %s, appProtocol %s", name, p, port, name, name)
		}
	}
	for k, v := range s.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, the pods have %q", k, v, d.Spec.Template.Labels[k])
		}
	}
}

// TestChartRefusesBadValues checks that values the service could not run with stop
// the render with a message that names the value and the fix.
func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name       string
		vals       map[string]any
		skipSchema bool // reach the template's check behind the schema's
		want       string
	}{
		{"unknown redis type (schema)", map[string]any{"redis": map[string]any{"type": "clustered"}}, false, "/redis/type"},
		{"unknown redis type (template)", map[string]any{"redis": map[string]any{"type": "clustered"}}, true, "redis.type \"clustered\": write single, sentinel or cluster"},
		{"misspelt value", map[string]any{"redis": map[string]any{"urll": "redis:6379"}}, false, "urll"},
		{"misspelt top-level value", map[string]any{"replicas": 3}, false, "replicas"},
		{"empty redis url", map[string]any{"redis": map[string]any{"url": ""}}, false, "redis.url"},
		{"both disruption bounds", map[string]any{"podDisruptionBudget": map[string]any{"minAvailable": 1, "maxUnavailable": 1}}, false, "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := renderChart(tt.vals, tt.skipSchema)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("helm template = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// TestStrictDecodeRejectsTypos proves that the decoding above can fail: each case
// misspells one field of a correct document, which must then be refused.
func TestStrictDecodeRejectsTypos(t *testing.T) {
	all := render(t, readValues(t, "helm/tollgate/ci/all-features-values.yaml"))
	if _, err := decodeManifest(all); err != nil {
		t.Fatalf("the correct release does not decode: %v", err)
	}
	tests := []struct{ name, from, to string }{
		{"Deployment probe", "readinessProbe:", "readinesProbe:"},
		{"Deployment security context", "readOnlyRootFilesystem:", "readOnlyRootFileSystem:"},
		{"Service port", "targetPort:", "targetport:"},
		{"PodDisruptionBudget", "maxUnavailable:", "maxUnavailble:"},
		{"HorizontalPodAutoscaler", "averageUtilization:", "averageUtilisation:"},
		{"ServiceMonitor", "scrapeTimeout:", "scrapeTimout:"},
		{"ConfigMap", "\ndata:\n", "\ndatas:\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(all, tt.from) {
				t.Fatalf("the release has no %q to misspell", tt.from)
			}
			_, err := decodeManifest(strings.Replace(all, tt.from, tt.to, 1))
			if err == nil || !strings.Contains(err.Error(), "unknown field") {
				t.Errorf("decode with %q for %q = %v, want an unknown field error", tt.to, tt.from, err)
			}
		})
	}
	t.Run("Istio EnvoyFilter", func(t *testing.T) {
		b := readFile(t, "examples/istio/envoyfilter.yaml")
		if err := checkEnvoyFilters(b); err != nil {
			t.Fatalf("the correct example does not decode: %v", err)
		}
		for _, typo := range []struct{ from, to string }{
			{"workloadSelector:", "workloadSelecter:"},    // the Kubernetes object's spec (istio.io/api)
			{"failure_mode_deny:", "failure_mode_denny:"}, // Envoy's filter config inside the patch
			{"descriptor_key:", "descriptorkey:"},         // the virtual host's rate limit actions
		} {
			bad := bytes.Replace(b, []byte(typo.from), []byte(typo.to), 1)
			if err := checkEnvoyFilters(bad); err == nil {
				t.Errorf("EnvoyFilter with %q for %q decodes, want an error", typo.to, typo.from)
			}
		}
	})
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// splitYAML splits a multi-document YAML file.
func splitYAML(b []byte) [][]byte {
	var out [][]byte
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			out = append(out, doc)
		}
	}
	return out
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// TestExamples decodes every example strictly: the Istio EnvoyFilters into
// istio.io/api's EnvoyFilter and each patch into the Envoy type it patches, the
// ConfigMap into core/v1; and checks that they point at the chart's Service as
// rendered.
func TestExamples(t *testing.T) {
	objs, err := decodeManifest(render(t, readValues(t, "examples/istio/values.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	svc := objs.services[0]
	var grpcPort int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			grpcPort = p.Port
		}
	}
	host := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, releaseNamespace)
	istioCluster := fmt.Sprintf("outbound|%d||%s", grpcPort, host)

	t.Run("istio", func(t *testing.T) {
		for _, f := range []string{"examples/istio/envoyfilter.yaml", "examples/istio/envoyfilter-cluster.yaml"} {
			b := readFile(t, f)
			if err := checkEnvoyFilters(b); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		// The filter names Istio's cluster of the chart's gRPC port; the added cluster
		// reaches the same host and port.
		if b := readFile(t, "examples/istio/envoyfilter.yaml"); !bytes.Contains(b, []byte("cluster_name: "+istioCluster+"\n")) {
			t.Errorf("envoyfilter.yaml does not name the cluster %s", istioCluster)
		}
		b := readFile(t, "examples/istio/envoyfilter-cluster.yaml")
		if !bytes.Contains(b, []byte("address: "+host+"\n")) || !bytes.Contains(b, []byte(fmt.Sprintf("port_value: %d\n", grpcPort))) {
			t.Errorf("envoyfilter-cluster.yaml does not reach %s:%d", host, grpcPort)
		}

		var cm corev1.ConfigMap
		if err := unmarshalStrict(readFile(t, "examples/istio/ratelimit-config.yaml"), &cm); err != nil {
			t.Fatalf("ratelimit-config.yaml: %v", err)
		}
		d := objs.deployments[0]
		var mounted string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "erl-config" && v.ConfigMap != nil {
				mounted = v.ConfigMap.Name
			}
		}
		if cm.Name != mounted || cm.Namespace != releaseNamespace {
			t.Errorf("ConfigMap %s/%s, the chart mounts %q in %s", cm.Namespace, cm.Name, mounted, releaseNamespace)
		}
		var erl struct {
			Domain string `json:"domain"`
		}
		if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &erl); err != nil || erl.Domain != "ingress-ratelimit" ||
			!bytes.Contains(readFile(t, "examples/istio/envoyfilter.yaml"), []byte("domain: "+erl.Domain+"\n")) {
			t.Errorf("the ERL config's domain %q (err %v) is not the filter's", erl.Domain, err)
		}
	})

}

// checkEnvoyFilters decodes every EnvoyFilter of a file: its object strictly, its
// spec with protojson into istio.io/api's EnvoyFilter (unknown fields refused), and
// each patch's value into the Envoy type its applyTo names, validated.
func checkEnvoyFilters(b []byte) error {
	docs := splitYAML(b)
	if len(docs) == 0 {
		return fmt.Errorf("no document")
	}
	for i, doc := range docs {
		var obj struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
			Spec            json.RawMessage   `json:"spec"`
		}
		if err := unmarshalStrict(doc, &obj); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		if obj.APIVersion != "networking.istio.io/v1alpha3" || obj.Kind != "EnvoyFilter" {
			return fmt.Errorf("document %d: %s %s, want networking.istio.io/v1alpha3 EnvoyFilter", i+1, obj.APIVersion, obj.Kind)
		}
		if err := checkEnvoyFilterSpec(obj.Spec); err != nil {
			return fmt.Errorf("EnvoyFilter %s: %w", obj.Metadata.Name, err)
		}
	}
	return nil
}

// envoyFilterPatch decodes a patch value for what applyTo names. A nil message means
// the tests have no type for it.
func envoyFilterPatch(applyTo string) (proto.Message, bool) {
	switch applyTo {
	case "HTTP_FILTER":
		return newHTTPFilter(), true
	case "CLUSTER":
		return newCluster(), true
	case "VIRTUAL_HOST":
		return newVirtualHost(), false // a MERGE fragment: no name or domains to validate
	}
	return nil, false
}

// validator is what go-control-plane's generated messages offer.
type validator interface{ ValidateAll() error }

func checkEnvoyFilterSpec(raw json.RawMessage) error {
	spec := newEnvoyFilter()
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(raw, spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	for i, cp := range envoyFilterPatches(spec) {
		if cp.value == nil {
			return fmt.Errorf("configPatches[%d]: no patch value", i)
		}
		msg, validate := envoyFilterPatch(cp.applyTo)
		if msg == nil {
			return fmt.Errorf("configPatches[%d]: applyTo %s: no Envoy type to check it against (add one to envoyFilterPatch)", i, cp.applyTo)
		}
		j, err := protojson.Marshal(cp.value)
		if err != nil {
			return fmt.Errorf("configPatches[%d]: %w", i, err)
		}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(j, msg); err != nil {
			return fmt.Errorf("configPatches[%d] (%s): %w", i, cp.applyTo, err)
		}
		if v, ok := msg.(validator); ok && validate {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("configPatches[%d] (%s): %w", i, cp.applyTo, err)
			}
		}
		if err := validateTypedConfig(msg); err != nil {
			return fmt.Errorf("configPatches[%d] (%s): %w", i, cp.applyTo, err)
		}
	}
	return nil
}
