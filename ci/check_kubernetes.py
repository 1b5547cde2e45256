"""Validate the Kubernetes manifests under examples/kubernetes/ (make check).

Built-in kinds (Service, Job) are validated by kubernetes-validate against the newest Kubernetes
schema it ships, strictly (an unknown field fails). An MPIJob (Kubeflow's MPI Operator,
kubeflow.org/v2beta1) is a custom resource kubernetes-validate has no schema for, and its
CustomResourceDefinition (manifests/base/kubeflow.org_mpijobs.yaml in kubeflow/mpi-operator) is
576 KB, almost all of it a copy of the Pod schema: so its own fields are checked against the CRD's
top level, written out below, and each replica's pod template against Kubernetes' PodTemplateSpec
by kubernetes-validate, which is what the CRD embeds.

Exit 0 when every resource passes; 1 naming each that does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

_INT = {"type": "integer", "minimum": 0}
# the MPIJob v2beta1 CRD's top level: spec's fields and a replica spec's, the template aside
MPIJOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"},
        "kind": {"const": "MPIJob"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["mpiReplicaSpecs"],
            "additionalProperties": False,
            "properties": {
                "slotsPerWorker": _INT,
                "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
                "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
                "runLauncherAsWorker": {"type": "boolean"},
                "sshAuthMountPath": {"type": "string"},
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "activeDeadlineSeconds": _INT, "backoffLimit": _INT, "ttlSecondsAfterFinished": _INT,
                        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                        "suspend": {"type": "boolean"}, "managedBy": {"type": "string"},
                        "schedulingPolicy": {"type": "object"},
                    },
                },
                "mpiReplicaSpecs": {
                    "type": "object",
                    "required": ["Launcher", "Worker"],
                    "additionalProperties": False,
                    "properties": {role: {
                        "type": "object",
                        "required": ["template"],
                        "additionalProperties": False,
                        "properties": {"replicas": _INT, "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                                       "template": {"type": "object"}},
                    } for role in ("Launcher", "Worker")},
                },
            },
        },
    },
}


def check(doc: dict, version: str) -> list[str]:
    """The failures of one resource (empty when it passes)."""
    if doc.get("kind") != "MPIJob":
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as e:
            return [str(getattr(e, "message", e))]
        return []
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(MPIJOB).iter_errors(doc)]
    for role, spec in (doc.get("spec", {}).get("mpiReplicaSpecs") or {}).items():
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
                   "template": spec.get("template")}
        try:
            kubernetes_validate.validate(wrapped, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{role} template: {e.message}")
    return errors


def main(paths: list[str]) -> int:
    version = kubernetes_validate.latest_version()
    failed = 0
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc:
                continue
            what = f"{path}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            errors = check(doc, version)
            failed += bool(errors)
            print(("FAIL  " if errors else "ok    ") + what + (" (Kubernetes " + version + ")"))
            for e in errors:
                print("      " + e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or sorted(str(p) for p in Path("examples/kubernetes").glob("*.yaml"))))
