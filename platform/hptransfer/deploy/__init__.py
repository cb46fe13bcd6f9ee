"""Deployment edges: render KubeRay RayJobs (`render`), submit to a Ray cluster (`ray_jobs`),
apply to Kubernetes (`kube`). Nothing here is imported by the pipeline itself."""
