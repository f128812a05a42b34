"""Running a run's agent steps on a Ray cluster (optional: ``acp-orchestrator[ray]``).

Nothing here imports Ray until a run asks for a cluster. The driver (the process that runs
``orchestrator run --cluster ...``) keeps the run store, the merges and the apply; each agent
step instance is placed on a node with free ``agent_slots``, where a supervisor actor hosts the
one-machine supervisor and runs the turn on a branch directory made from the instance's tree,
shipped as a content-addressed manifest and blobs.
"""

from ._connect import CLUSTER_ENV, ClusterSpec, cluster_spec
from ._coordinator import Rate, parse_rate

__all__ = ["CLUSTER_ENV", "ClusterSpec", "Rate", "cluster_spec", "parse_rate"]
