"""Reading deploy/'s Kubernetes manifests in tests, without a cluster or kubectl: a small
kustomize (kustomize.py, its patches in strategic_merge.py) and the Inference Extension's CRD
schemas (crd.py)."""
