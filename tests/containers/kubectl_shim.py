"""A stand-in for ``kubectl`` over the container harness (``tests/containers/kube``), for the
runbooks' tests: it plays the few commands the runbooks use on the harness's pods, and
refuses any other (exit 1, naming it), so a runbook that starts using another command fails
its test until the command is played here.

Played (``NS`` must be the stack's namespace, as kubectl would find nothing elsewhere):

- ``kubectl -n NS port-forward svc/NAME LOCAL:REMOTE``: listens on 127.0.0.1:LOCAL and
  forwards each connection to REMOTE of the Service's endpoint pod, until SIGTERM; prints
  kubectl's ``Forwarding from 127.0.0.1:LOCAL -> REMOTE``.
- ``kubectl -n NS get secret NAME -o jsonpath={.data.KEY}``: the Secret's value, base64.
- ``kubectl -n NS exec deploy/NAME -- CMD...``: ``docker exec`` in the workload's pod's first
  container, with the harness's one rewrite applied to CMD (what is ``127.0.0.1`` in a pod is
  the pod's own address here: ``containerspec.rewrite_value``).

The harness's state comes from the JSON file ``$ELASTIC_CTR_KUBECTL_STATE`` (``write_state``).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

STATE_ENV = "ELASTIC_CTR_KUBECTL_STATE"


def write_state(path: Path, namespace: str, services: dict[str, str], workloads: dict[str, tuple[str, str]],
                secrets: dict[str, dict[str, str]], docker_env: dict[str, str]) -> None:
    """Writes what the shim plays on: ``services`` name -> an endpoint pod's IP;
    ``workloads`` name -> (first container's id, pod IP); ``secrets`` name -> {key: value};
    ``docker_env``: the engine's client environment (``DOCKER_HOST``)."""
    path.write_text(json.dumps({"namespace": namespace, "services": services,
                                "workloads": {k: list(v) for k, v in workloads.items()}, "secrets": secrets,
                                "docker_env": docker_env}))


def _fail(msg: str) -> int:
    print(f"kubectl (test stand-in): {msg}", file=sys.stderr)
    return 1


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def port_forward(ip: str, local: int, remote: int) -> int:
    server = socket.create_server(("127.0.0.1", local))
    print(f"Forwarding from 127.0.0.1:{local} -> {remote}", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            upstream = socket.create_connection((ip, remote), timeout=10)
        except OSError as exc:
            print(f"error forwarding port {remote}: {exc}", file=sys.stderr, flush=True)
            conn.close()
            continue
        upstream.settimeout(None)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """``(namespace, verb, operands)`` of a command the shim plays; ``ValueError`` naming
    what it does not play."""
    if argv[:1] != ["-n"] or len(argv) < 3:
        raise ValueError(f"expected `kubectl -n NAMESPACE ...`, got {argv}")
    ns, verb, rest = argv[1], argv[2], argv[3:]
    if verb == "port-forward" and len(rest) == 2 and rest[0].startswith("svc/"):
        local, _, remote = rest[1].partition(":")
        return ns, verb, [rest[0].removeprefix("svc/"), local, remote or local]
    if verb == "get" and rest[:1] == ["secret"] and len(rest) == 4 and rest[2] == "-o" \
            and rest[3].startswith("jsonpath={.data.") and rest[3].endswith("}"):
        return ns, verb, [rest[1], rest[3].removeprefix("jsonpath={.data.").removesuffix("}")]
    if verb == "exec" and rest[:1] and rest[0].startswith("deploy/") and rest[1:2] == ["--"] and rest[2:]:
        return ns, verb, [rest[0].removeprefix("deploy/"), *rest[2:]]
    raise ValueError(f"not played here: kubectl {' '.join(argv)}")


def main(argv: list[str]) -> int:
    state = json.loads(Path(os.environ[STATE_ENV]).read_text())
    try:
        ns, verb, ops = parse(argv)
    except ValueError as exc:
        return _fail(str(exc))
    if ns != state["namespace"]:
        return _fail(f"namespace {ns!r}: the stack's is {state['namespace']!r}")
    if verb == "port-forward":
        name, local, remote = ops
        if name not in state["services"]:
            return _fail(f'services "{name}" not found')
        return port_forward(state["services"][name], int(local), int(remote))
    if verb == "get":
        name, key = ops
        try:
            value = state["secrets"][name][key]
        except KeyError:
            return _fail(f'secret "{name}" has no key {key!r}')
        sys.stdout.write(base64.b64encode(value.encode()).decode())
        return 0
    name, cmd = ops[0], ops[1:]
    if name not in state["workloads"]:
        return _fail(f'deployments.apps "{name}" not found')
    cid, ip = state["workloads"][name]
    from tests.containers.kube.containerspec import rewrite_value

    return subprocess.run(["docker", "exec", cid, *[rewrite_value(a, ip) for a in cmd]],
                          env={**os.environ, **state["docker_env"]}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
