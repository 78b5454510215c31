"""The Kubernetes sandbox backend: one pod per rollout (registered as ``kubernetes``).

Importing this package does not import the ``kubernetes`` client; the backend does when it is constructed
(``pip install 'openforge[k8s]'``). See docs/kubernetes.md.
"""

from .backend import KubernetesBackend
from .config import KubernetesConfig

__all__ = ["KubernetesBackend", "KubernetesConfig"]
