package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// object is one rendered manifest, decoded.
type object struct {
	Kind, Name string
	Obj        any
}

// kustomize renders dir with kubectl kustomize (the test is skipped only
// when kubectl is not installed).
func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed (Debian: apt-get install kubectl): the manifests are not rendered")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", dir, err, stderr.String())
	}
	return out
}

// decodeStrict decodes one YAML document into the k8s.io/api type of its
// kind; an unknown or misspelt field, a duplicate key or an unknown kind
// fails.
func decodeStrict(doc []byte) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &tm); err != nil {
		return object{}, err
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/Namespace":
		obj = &corev1.Namespace{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "apps/v1/StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	default:
		return object{}, fmt.Errorf("%s %s: kind %s/%s is not one the test knows", tm.Kind, tm.Metadata.Name, tm.APIVersion, tm.Kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return object{}, fmt.Errorf("%s %s: %w", tm.Kind, tm.Metadata.Name, err)
	}
	return object{Kind: tm.Kind, Name: tm.Metadata.Name, Obj: obj}, nil
}

// splitDocs splits kubectl kustomize's output into its documents.
func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(d) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// render renders and strictly decodes every object of dir.
func render(t *testing.T, dir string) []object {
	t.Helper()
	var objs []object
	for _, d := range splitDocs(kustomize(t, dir)) {
		o, err := decodeStrict(d)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		objs = append(objs, o)
	}
	return objs
}

// TestStrictDecodeCatchesMisspeltField: the decoder the manifests go
// through refuses a misspelt field (readinesProbe), a duplicate key and
// a field of the wrong type.
func TestStrictDecodeCatchesMisspeltField(t *testing.T) {
	base := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n        - name: c\n          image: i\n"
	if _, err := decodeStrict([]byte(base + "          readinessProbe: {tcpSocket: {port: 1}}\n")); err != nil {
		t.Fatalf("a correct Deployment is refused: %v", err)
	}
	for name, doc := range map[string]string{
		"misspelt field": base + "          readinesProbe: {tcpSocket: {port: 1}}\n",
		"duplicate key":  base + "          image: j\n",
		"wrong type":     base + "          ports: 80\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// podOf returns the pod template of a workload.
func podOf(o object) (*corev1.PodTemplateSpec, bool) {
	switch v := o.Obj.(type) {
	case *appsv1.Deployment:
		return &v.Spec.Template, true
	case *appsv1.StatefulSet:
		return &v.Spec.Template, true
	}
	return nil, false
}

// longRunning are the containers that serve: main containers and native
// sidecars (init containers with restartPolicy Always).
func longRunning(p *corev1.PodSpec) []corev1.Container {
	out := append([]corev1.Container(nil), p.Containers...)
	for _, c := range p.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	return out
}

func checkPod(t *testing.T, where string, tpl *corev1.PodTemplateSpec) {
	p := &tpl.Spec
	sc := p.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: pod securityContext.runAsNonRoot is not true", where)
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod seccompProfile is not RuntimeDefault", where)
	}
	if tpl.Annotations["prometheus.io/scrape"] != "true" && !strings.HasPrefix(where, "StatefulSet hams-nats") {
		t.Errorf("%s: no prometheus.io/scrape annotation", where)
	}
	all := append(append([]corev1.Container(nil), p.InitContainers...), p.Containers...)
	for _, c := range all {
		cw := where + " container " + c.Name
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("%s: no %s request", cw, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				t.Errorf("%s: no %s limit", cw, r)
			}
		}
		cs := c.SecurityContext
		switch {
		case cs == nil:
			t.Errorf("%s: no securityContext", cw)
		case cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem:
			t.Errorf("%s: readOnlyRootFilesystem is not true", cw)
		case cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation:
			t.Errorf("%s: allowPrivilegeEscalation is not false", cw)
		case cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL":
			t.Errorf("%s: capabilities do not drop ALL", cw)
		}
	}
	for _, c := range longRunning(p) {
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s container %s: a readiness and a liveness probe are required", where, c.Name)
		}
	}
}

// TestManifests renders every overlay and checks every object.
func TestManifests(t *testing.T) {
	hams := hamsFlags(t)
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			objs := append(render(t, filepath.Join("overlays", svc)), render(t, filepath.Join("overlays", svc, "spares"))...)
			kinds := map[string]int{}
			pods := map[string]*corev1.PodTemplateSpec{} // instance pods by "<model>/<role>"
			for _, o := range objs {
				kinds[o.Kind]++
				where := o.Kind + " " + o.Name
				if s, ok := o.Obj.(*corev1.Service); ok && s.Name == "hams-frontend" {
					var ports []int32
					for _, p := range s.Spec.Ports {
						ports = append(ports, p.Port)
					}
					if fmt.Sprint(ports) != "[8500 8501]" {
						t.Errorf("%s: ports %v, want the client ports [8500 8501] only", where, ports)
					}
				}
				tpl, ok := podOf(o)
				if !ok {
					continue
				}
				checkPod(t, where, tpl)
				for _, c := range append(append([]corev1.Container(nil), tpl.Spec.InitContainers...), tpl.Spec.Containers...) {
					if strings.HasPrefix(c.Image, "hams:") {
						checkArgs(t, where+" container "+c.Name, c.Args, hams)
					}
				}
				if tpl.Labels["app.kubernetes.io/component"] == "instance" {
					checkInstance(t, where, tpl)
					pods[tpl.Labels["hams.dev/model"]+"/"+tpl.Labels["hams.dev/instance-role"]] = tpl
				}
			}
			for _, k := range []string{"StatefulSet", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered", k)
				}
			}
			checkAntiAffinity(t, pods)
			t.Logf("%s: %d objects %v, %d model instances", svc, len(objs), kinds, len(pods))
		})
	}
}

// checkInstance: the sidecar is a native sidecar beside the model
// server, both with /dev/shm on a memory emptyDir.
func checkInstance(t *testing.T, where string, tpl *corev1.PodTemplateSpec) {
	p := &tpl.Spec
	var sidecar *corev1.Container
	for i, c := range p.InitContainers {
		if c.Name == "sidecar" {
			sidecar = &p.InitContainers[i]
		}
	}
	for _, c := range p.Containers {
		if c.Name == "sidecar" {
			t.Errorf("%s: the sidecar is a main container; it must be a native sidecar (an initContainer with restartPolicy Always)", where)
		}
	}
	if sidecar == nil {
		t.Errorf("%s: no sidecar initContainer", where)
		return
	}
	if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: the sidecar initContainer has no restartPolicy Always (it is not a native sidecar)", where)
	}
	var ms *corev1.Container
	for i, c := range p.Containers {
		if c.Name == "modelserver" {
			ms = &p.Containers[i]
		}
	}
	if ms == nil {
		t.Errorf("%s: no modelserver container", where)
		return
	}
	shm := ""
	for _, v := range p.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
			for _, c := range []*corev1.Container{sidecar, ms} {
				for _, m := range c.VolumeMounts {
					if m.Name == v.Name && m.MountPath == "/dev/shm" {
						shm += c.Name + " "
					}
				}
			}
		}
	}
	if shm != "sidecar modelserver " {
		t.Errorf("%s: /dev/shm on a memory emptyDir is mounted in [%s], want both the sidecar and the model server", where, strings.TrimSpace(shm))
	}
}

// checkAntiAffinity: a primary and the instance that takes over from it
// (a stateful model's backup, a stateless model's standby) may not be
// scheduled on one node: the primary's required anti-affinity selects
// the other's pod labels, and the reverse.
func checkAntiAffinity(t *testing.T, pods map[string]*corev1.PodTemplateSpec) {
	for key, prim := range pods {
		model, role, _ := strings.Cut(key, "/")
		if role != "primary" {
			continue
		}
		other := pods[model+"/backup"]
		if other == nil {
			other = pods[model+"/standby"]
		}
		if other == nil {
			continue
		}
		for _, pair := range [][2]*corev1.PodTemplateSpec{{prim, other}, {other, prim}} {
			if !repels(pair[0], pair[1]) {
				t.Errorf("model %s: the %s pod's required anti-affinity does not keep the %s pod off its node", model, pair[0].Labels["hams.dev/instance-role"], pair[1].Labels["hams.dev/instance-role"])
			}
		}
	}
}

func repels(a, b *corev1.PodTemplateSpec) bool {
	if a.Spec.Affinity == nil || a.Spec.Affinity.PodAntiAffinity == nil {
		return false
	}
	for _, term := range a.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if term.TopologyKey != "kubernetes.io/hostname" || term.LabelSelector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && sel.Matches(labels.Set(b.Labels)) {
			return true
		}
	}
	return false
}

// hamsFlags builds the hams binary (or takes $HAMS_BIN) and reads the
// flags of every role from `hams <role> -h`.
func hamsFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	bin := os.Getenv("HAMS_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "hams")
		cmd := exec.Command("go", "build", "-o", bin, "../../cmd/hams")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build hams: %v\n%s", err, out)
		}
	}
	flagLine := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--?([a-z0-9][a-z0-9-]*)`)
	out := map[string]map[string]bool{}
	var mu sync.Mutex
	for _, role := range []string{"nats", "manager", "frontend", "sidecar", "modelserver"} {
		cmd := exec.Command(bin, role, "-h")
		b, _ := cmd.CombinedOutput() // -h may exit non-zero
		fl := map[string]bool{}
		for _, m := range flagLine.FindAllStringSubmatch(string(b), -1) {
			fl[m[1]] = true
		}
		if len(fl) < 3 {
			t.Fatalf("hams %s -h lists %d flags; output:\n%s", role, len(fl), b)
		}
		mu.Lock()
		out[role] = fl
		mu.Unlock()
	}
	return out
}

// checkArgs: a hams container's first argument is a role and every flag
// it passes is one `hams <role> -h` lists.
func checkArgs(t *testing.T, where string, args []string, known map[string]map[string]bool) {
	if len(args) == 0 {
		t.Errorf("%s: no arguments (want a hams role first)", where)
		return
	}
	fl, ok := known[args[0]]
	if !ok {
		t.Errorf("%s: %q is not a hams role the test knows", where, args[0])
		return
	}
	var unknown []string
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") {
			t.Errorf("%s: argument %q is not a flag (write --flag=value)", where, a)
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !fl[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		t.Errorf("%s: hams %s does not know the flags %v (hams %s -h)", where, args[0], unknown, args[0])
	}
}
