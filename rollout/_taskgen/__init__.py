"""Task generators: families of templates instantiated by seed into task folders (``rollout.generate_tasks``)."""

from ._generate import (
    FAMILIES,
    Plan,
    TaskGenError,
    generate_tasks,
    plan,
    split_of,
    task_families,
    write,
)

__all__ = ["FAMILIES", "Plan", "TaskGenError", "generate_tasks", "plan", "split_of", "task_families", "write"]
