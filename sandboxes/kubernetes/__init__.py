"""The Kubernetes API server sandbox (``app.KubernetesSandbox``): a small GPU cluster for the kubernetes adapter."""
