"""Deploying bugsweep to a Prefect server: a work pool, then every deployment of prefect.yaml.

prefect.yaml says what is deployed; this package only runs the two Prefect commands a person would run
(`prefect work-pool create`, `prefect deploy --name ...` for each deployment) with the right options, so `bugsweep deploy` is one step.
See docs/pipeline.md for the walk-through, and for docker and kubernetes pools.
"""

from deployments.deploy import DEPLOYMENTS, DeployResult, deploy, ensure_work_pool, worker_command

__all__ = ["DEPLOYMENTS", "DeployResult", "deploy", "ensure_work_pool", "worker_command"]
