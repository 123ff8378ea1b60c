// Package kubernetes holds the Kubernetes manifests of a HAMS-Go
// deployment (kustomize: base/ and overlays/<service>/, generated from
// examples/*.yaml and instance.yaml.tmpl). docs/kubernetes.md describes
// them; the package's tests render every overlay with kubectl kustomize,
// decode every object strictly into the k8s.io/api types and check
// probes, security contexts, resources, native sidecars, anti-affinity
// and the hams flags the containers pass.
package kubernetes
