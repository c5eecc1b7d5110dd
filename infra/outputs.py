"""The stack outputs ``infra.program.build()`` returns (``pulumi stack output NAME``): what
each holds, for the Stack configuration page (``docs/hooks/reference.py``).
``tests/docs/test_site.py`` renders the stacks under mocks and checks that every output
the program exports is described here, and nothing else."""
from __future__ import annotations

#: output name -> (when it is there, what it holds)
STACK_OUTPUTS: dict[str, tuple[str, str]] = {
    "namespace": ("always", "The stack's Kubernetes namespace (`namespace`)."),
    "servingUrl": ("always", "Serving's in-cluster base URL, `http://serving.<namespace>.svc.cluster.local:8000`: "
                             "the Open Inference Protocol v2 REST API (`/v2/...`), `POST /predict` and `/metrics`."),
    "servingGrpcTarget": ("always", "Serving's in-cluster gRPC target, `serving.<namespace>.svc.cluster.local:8001` "
                                    "(`inference.GRPCInferenceService`)."),
    "fileServerUrl": ("with the file server (no `modelRoot`)",
                      "The file server's URL for clients outside the cluster: its LoadBalancer's address with "
                      "`exposeFileServer`, else the in-cluster URL."),
    "fileServerClusterUrl": ("with the file server (no `modelRoot`)",
                             "The file server's in-cluster URL, `http://fileserver.<namespace>.svc.cluster.local:8080`."),
    "modelRoot": ("with `modelRoot` (an object store)", "The versions' root on the object store, as set."),
    "transferStatusUrl": ("always", "The cube transfer's `/dict/info` (in-cluster): the version served, the pin, "
                                    "the last rollout. `elastic-ctr rollback` talks to the same Service "
                                    "([Rollback on a cluster](../runbooks/rollback-on-a-cluster.md))."),
    "cubeTopology": ("always", "The cube topology serving and the transfer mount (docs: Contracts): the dict "
                               "name and, per shard, each replica's data-plane, HTTP and agent addresses."),
    "trainingJob": ("always", "The training job as `<namespace>/<name>` (a Volcano Job: "
                              "`kubectl get vcjob -n <namespace> <name>`)."),
    "images": ("always", "The role images each Deployment, StatefulSet and the Job run (`cube`, `serving`, "
                         "`trainer`, `tracking`), by digest once pushed to `imageRegistry`."),
    "trackingUrl": ("with `trackingServer`", "The MLflow tracking server's in-cluster URL."),
    "monitoring": ("always", "What monitoring declared: `mode` (the `monitoring` key), the ServiceMonitors and "
                             "PodMonitors (`monitors`), the PrometheusRule (`rule`) and the Grafana dashboards' "
                             "ConfigMaps (`dashboards`)."),
}
