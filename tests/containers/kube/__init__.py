"""A test harness that runs a rendered elastic-ctr stack as Docker containers, the way
Kubernetes (and Volcano) would run it on one node.

Input: the manifests ``infra.render.render(stack, overrides)`` returns (or the files
``elastic-ctr render --stack NAME --out DIR`` writes). Every pod of every workload becomes
one Docker container per (init) container, from the image the manifest names, with exactly
the rendered command, args and environment. Nothing is added to a container's command line
beyond what the kubelet and the container runtime would add, with ONE exception (below).

How each Kubernetes concept is played
-------------------------------------
* **Pod network.** Each pod gets its own loopback address ``127.0.0.x`` (allocated in
  workload order; ``Cluster.ip(pod)``). Containers run with ``--network host`` (no Docker
  network is ever created), so "the pod IP" is an address the container can bind and every
  other container and the host can reach. ``fieldRef status.podIP`` is that address.
* **THE ONE REWRITE.** All containers share the host's network namespace, whereas in
  Kubernetes each pod has its own. So that a role that binds "all interfaces" or talks to a
  sibling container over the pod's loopback behaves as in its own namespace, the harness
  rewrites, in a container's ``args`` and in its ``env`` values ONLY (never ``command``,
  files, ConfigMaps or probes), each whole-token occurrence of

    - the bind-all address ``0.0.0.0``,
    - the in-pod loopback references ``127.0.0.1`` and ``localhost``

  to that pod's ``127.0.0.x``. Every rewrite is logged (``Cluster.rewrites`` and the harness
  log: pod, container, field, before, after). A ``command`` containing one of these tokens is
  refused (``UnsupportedField``), since leaving it would break the isolation silently.
  A role that binds ``0.0.0.0`` *by itself* (not from its args/env) still binds every
  address; two pods doing so on one port collide, as they would never in Kubernetes. That is
  reported as a failure of the pod, never worked around.
* **Cluster DNS** as ``--add-host`` entries (the same table in every container, plus the
  pod's own hostname): StatefulSet pods ``<pod>.<serviceName>.<ns>.svc.cluster.local`` and its
  short forms ``<pod>.<serviceName>[.<ns>[.svc]]``; Volcano ``svc``-plugin pods
  ``<job>-<task>-<i>.<job>`` (+ the same longer forms); Services ``<svc>``, ``<svc>.<ns>``,
  ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.cluster.local`` -> the address of ONE pod of the
  Service: the harness picks the first pod (slot 0) the selector matches. For a Service
  backed by several pods (``serving``) in-cluster clients therefore always reach slot 0's
  pod; a replacement pod takes over the address slot of the pod it replaces, so a Service
  name keeps reaching a live pod, as a ClusterIP would. The entries exist from the start
  (a headless Service without ``publishNotReadyAddresses`` would only list ready pods).
  Service links (``<SVC>_SERVICE_HOST`` ...) are set as the kubelet sets them.
* **Pods, init containers, restart.** A pod's init containers run one after the other to
  completion (exit 0) before its containers start; containers start together. Container
  hostname = pod hostname (``--hostname``). No container is ever restarted: an exit of a
  ``restartPolicy: Always`` container, or a liveness probe failing ``failureThreshold``
  times, is recorded in ``Cluster.errors`` (the kubelet would restart it; a test asserts
  there is none) instead of being hidden by a restart.
* **Security context.** runAsUser/runAsGroup -> ``--user uid[:gid]``; fsGroup and
  supplementalGroups -> ``--group-add``; runAsNonRoot checked (uid 0 refused, as the kubelet
  refuses); readOnlyRootFilesystem -> ``--read-only``; capabilities -> ``--cap-drop``/
  ``--cap-add``; allowPrivilegeEscalation false -> ``--security-opt no-new-privileges``;
  seccompProfile RuntimeDefault = Docker's default profile.
* **Volumes.** configMap / secret -> files written on the host (``items``, ``defaultMode``)
  and mounted read-only; emptyDir -> a fresh host directory per pod (removed when the pod is
  deleted); persistentVolumeClaim -> one host directory per claim, shared by every pod that
  mounts the claim; StatefulSet volumeClaimTemplates -> claim ``<tpl>-<pod>`` (kept across
  pod replacement). Host directories are owned ``runAsUser:fsGroup`` mode 2775. All live
  under the harness work directory (a pytest ``tmp_path``).
* **Resources.** ``limits.memory`` -> ``--memory`` (and ``--memory-swap``): a role over its
  limit is OOM-killed as in Kubernetes.
* **Probes** (readinessProbe, livenessProbe, startupProbe; httpGet, tcpSocket, grpc, exec) are
  run against the pod address as the kubelet does (initialDelaySeconds, periodSeconds,
  timeoutSeconds, successThreshold, failureThreshold; HTTP 200-399 is success). Pod
  readiness = every container ready; ``Cluster.ready(pod)``, ``Cluster.endpoints(service)``
  (ready and not terminating, or every pod with ``publishNotReadyAddresses``; optionally a
  deleted pod stays listed ``propagation_s`` seconds, as kube-proxy lags the endpoints).
* **Deleting a pod the Kubernetes way** (``Cluster.delete_pod``): the pod is marked
  terminating (it leaves every Service's endpoints at once), preStop hooks run (exec,
  httpGet, sleep), then SIGTERM (``docker kill --signal TERM``) to every container, and
  SIGKILL to whatever still runs ``terminationGracePeriodSeconds`` (default 30) after the
  deletion began. Exit codes, times and readiness transitions are returned. The owning
  Deployment/StatefulSet controller then creates the replacement (Deployment: new name,
  same address slot; StatefulSet: same name, same claims, fresh emptyDirs).
  ``Cluster.kill_pod`` is the crash variant (SIGKILL at once).
* **Controllers.** Deployment and StatefulSet ``replicas`` pods (StatefulSet
  ``podManagementPolicy: OrderedReady`` starts ordinal by ordinal, each once the previous
  one is ready; ``Parallel`` all at once).
* **A new rendering** (``Cluster.apply``): played as ``pulumi up`` applies a changed
  program: the difference by kind/namespace/name, creates and updates in dependency order,
  each StatefulSet and Deployment awaited as pulumi-kubernetes awaits it and rolled by its
  strategy (StatefulSet RollingUpdate/OnDelete, Deployment RollingUpdate with
  ``maxSurge``/``maxUnavailable`` or Recreate), a ConfigMap change reaching a pod only when
  the pod is replaced, deletions last. ``apply``'s docstring lists what it plays and not.
* **Volcano Job** (``batch.volcano.sh/v1alpha1``): pods ``<job>-<task>-<i>`` of every task are
  created together and started at one barrier (gang start; ``minAvailable`` must be
  satisfiable by the tasks' replicas). ``svc`` plugin: hostname ``<pod>`` + subdomain
  ``<job>``, env ``VC_<TASK>_HOSTS`` (comma-separated ``<pod>.<job>``) and ``VC_<TASK>_NUM``
  for every task, and the ConfigMap ``<job>-svc`` mounted at ``/etc/volcano`` (files
  ``<task>.host``, newline-separated, plus the ``VC_*`` keys), in containers and init
  containers, exactly as the plugin does. ``env`` plugin: ``VC_TASK_INDEX`` and
  ``VK_TASK_INDEX``. Task policy ``TaskCompleted -> CompleteJob``: once every pod of that
  task exited 0, every other running pod of the job is deleted the Kubernetes way and the
  job is ``Completed``. A failed pod makes the job ``Failed`` (see below).

Images: the rendered image must exist in the engine (no registry); ``image_map`` substitutes
another image for a rendered one (to try a fix before it is in the tree), logged loudly.

What it knowingly does not play (each with why that is safe here) is listed in
``schema.IGNORED``; any other field fails with ``UnsupportedField`` naming its path, before
any container starts.

Modules, by concern (each one's docstring details its part):

* ``cluster``: ``Cluster``, the entry point: wires the parts below, starts, deletes, queries.
* ``schema``: the fields played / ignored, and ``validate``; ``errors``: the two errors.
* ``manifests``: a rendering read into the ``store`` (Secrets, ConfigMaps, claims, Services).
* ``store``: what the API server would hold, plus the run's log and record; ``objects``:
  workloads, pods, containers; ``records``: rewrites and terminations.
* ``diff``: the steps between two renderings and their order (pure); ``apply``: playing
  them on a running cluster (rollouts, awaits, deletions).
* ``controllers``: Deployment/StatefulSet pods and replacements; ``volcano``: the Job, its
  plugins, gang start and job controller.
* ``dns``: cluster DNS, Service links, endpoints; ``env``: a container's environment;
  ``volumes``: volumes as host directories.
* ``containerspec``: a container as a ``docker run`` command line (security context,
  memory, mounts) and THE ONE REWRITE; ``engine``: the ``docker`` client, exit events, logs.
* ``kubelet``: running pods, tracking exits; ``probes``: probes and lifecycle hooks;
  ``termination``: deleting and killing pods.
"""
from tests.containers.kube.cluster import Cluster
from tests.containers.kube.errors import HarnessError, UnsupportedField

__all__ = ["Cluster", "HarnessError", "UnsupportedField"]
