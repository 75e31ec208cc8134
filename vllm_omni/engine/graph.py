"""The stage graph: the deploy config's stages and connectors checked against what a model
family needs. Every role the family uses must have exactly one stage, and every edge its
router sends along must be a declared connector (and no connector may join stages the
family never links), so the config describes the pipeline that actually runs."""

from __future__ import annotations

from vllm_omni.config import DeployConfig


class StageGraphError(ValueError):
    """The deploy config's stages or connectors do not fit the model family."""


def stage_name(deploy: DeployConfig, role: str) -> str:
    return f"{role} (stage_id {deploy.stage_by_role(role).stage_id})"


def check_stage_graph(deploy: DeployConfig, family_name: str, roles: tuple[str, ...],
                      edges: tuple[tuple[str, str], ...]) -> frozenset[tuple[str, str]]:
    """The declared edges as (from role, to role); raises StageGraphError naming each misfit."""
    problems = []
    declared_roles = [stage.role for stage in deploy.stages]
    for role in roles:
        if declared_roles.count(role) != 1:
            problems.append(f"{family_name} needs one stage with role {role!r}, the config has "
                            f"{declared_roles.count(role)}")
    problems += [f"stage {s.stage_id} has role {s.role!r}, which {family_name} does not use (roles: "
                 f"{', '.join(roles)})" for s in deploy.stages if s.role not in roles]
    if problems:
        raise StageGraphError("deploy config: " + "; ".join(problems))
    role_of = {stage.stage_id: stage.role for stage in deploy.stages}
    declared = {(role_of[c.from_stage], role_of[c.to_stage]): c.name for c in deploy.connectors}
    problems += [f"no connector from stage {deploy.stage_by_role(a).stage_id} ({a}) to stage "
                 f"{deploy.stage_by_role(b).stage_id} ({b}); {family_name} sends {a} outputs to {b}"
                 for a, b in edges if (a, b) not in declared]
    problems += [f"connector {name!r} joins {a} to {b}, which {family_name} never links"
                 for (a, b), name in declared.items() if (a, b) not in edges]
    if problems:
        raise StageGraphError("deploy config: " + "; ".join(problems))
    return frozenset(declared)


def replica_name(deploy: DeployConfig, role: str, index: int) -> str:
    """A stage replica as errors and logs name it (the stage's name alone when it has one)."""
    name = stage_name(deploy, role)
    return name if deploy.stage_by_role(role).replicas == 1 else f"{name} replica {index}"
