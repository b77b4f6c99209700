"""Write helm/efo/values.schema.json: the chart's values, with ``config`` and ``settings`` derived from
efo's own settings model (efo/config.py), so that a setting added there is known to the chart too.

``helm install`` validates the values against it before rendering: a typo in a setting's name, a
wrong type or a value outside an enum fails there, naming the path. Run after changing efo/config.py
or the chart's values; tests/unit/test_chart.py checks that the committed file is what this writes.

    .venv/bin/python deploy/values_schema.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from efo.config import DURATION_PATTERN, ENV_PREFIX, NESTED_DELIMITER, Settings

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "helm" / "efo" / "values.schema.json"

#: Settings the chart sets itself: EFO_METRICS_PORT from metrics.port, EFO_WORKER_ID from the pod name.
CHART_OWNED = ("metrics_port", "worker_id")
#: ``stream`` is required too, unless ``streams`` is set: the chart checks that at render (efo.checks).
REQUIRED = ("app", "sink")

_UNSET = {"type": "null"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PROBE = {
    "type": "object",
    "description": "A Kubernetes probe; enabled: false leaves it out.",
    "properties": {"enabled": {"type": "boolean"}},
    "required": ["enabled"],
}


def _field_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the settings model's schema, its ``$defs``) with chart-owned settings and requirements removed."""
    schema = Settings.model_json_schema()
    defs = schema.pop("$defs")
    for name in CHART_OWNED:
        schema["properties"].pop(name)
    schema.pop("required", None)
    spark_conf = defs["SparkSettings"]["properties"]["conf"]
    spark_conf["additionalProperties"] = {"type": ["string", "number", "boolean"]}  # the chart quotes them
    # In YAML, an entry of streams is a name or ARN, or a mapping (StreamEntry, no other keys); a
    # list names at least one stream (efo.config's _stream_entries reads them so).
    defs["StreamEntry"]["properties"]["stream"]["minLength"] = 1
    [entries, _] = schema["properties"]["streams"]["anyOf"]
    entries["items"] = {"anyOf": [{"type": "string", "minLength": 1}, entries["items"]]}
    entries["minItems"] = 1
    return schema, defs


def _env_value(field: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """What an EFO_* variable of this field may be in ``config``: its YAML value or its text."""
    if "$ref" in field:  # a whole section, e.g. EFO_POOL: {max_pending_records: 1000}
        return {"type": ["object", "string", "null"]}
    options = field.get("anyOf", [field])
    types = {option.get("type") for option in options} - {"null", None}
    described = {"description": field["description"]} if "description" in field else {}
    duration = next((o for o in options if o.get("pattern") == DURATION_PATTERN), None)
    if duration is not None:  # a number of seconds, or a text with its unit (5m); empty: not set
        number = next(o for o in options if o.get("type") == "number")
        bounds = {k: v for k, v in number.items() if k in ("minimum", "exclusiveMinimum")}
        pattern = "^(" + DURATION_PATTERN.removeprefix("^").removesuffix("$") + ")?$"
        return {"type": ["number", "string", "null"], "pattern": pattern, **bounds, **described}
    if "enum" in field:
        return {"enum": [*field["enum"], None, ""], **described}
    if types == {"integer"}:
        bounds = {k: v for k, v in field.items() if k in ("minimum", "maximum")}
        return {"type": ["integer", "string", "null"], "pattern": r"^[0-9]*$", **bounds, **described}
    if types == {"number"}:
        bounds = {k: v for k, v in field.items() if k in ("minimum", "exclusiveMinimum", "maximum")}
        return {"type": ["number", "string", "null"], "pattern": r"^([0-9]+(\.[0-9]*)?)?$", **bounds, **described}
    if types == {"object"}:
        return {"type": ["object", "string", "null"], **described}
    return {"type": ["string", "null"], **described}


def _config_schema(settings: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = {}

    def walk(fields: dict[str, Any], prefix: str) -> None:
        for name, field in fields.items():
            env = f"{prefix}{name.upper()}"
            properties[env] = _env_value(field, defs)
            if "$ref" in field:
                section = defs[field["$ref"].rsplit("/", 1)[-1]]
                walk(section["properties"], f"{env}{NESTED_DELIMITER}")

    walk(settings["properties"], ENV_PREFIX)
    return {
        "type": "object",
        "description": "EFO_* settings as environment variables. EFO_METRICS_PORT and EFO_WORKER_ID are the "
        "chart's (metrics.port, the pod name).",
        "properties": properties,
        "required": [f"{ENV_PREFIX}{name.upper()}" for name in REQUIRED],
        "additionalProperties": False,
    }


#: A number of pods, or a percentage of them ("25%"), as a Deployment's rollingUpdate takes them.
_COUNT_OR_PERCENT: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[0-9]+%$"}]
}


def _kubernetes_object(description: str) -> dict[str, Any]:
    return {"type": "object", "description": description}


def values_schema() -> dict[str, Any]:
    settings, defs = _field_schemas()
    settings_file = copy.deepcopy(settings)
    settings_file["description"] = "The settings as a YAML file (a ConfigMap, efo run --config); config wins."
    settings_file.pop("title", None)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the efo chart",
        "type": "object",
        "additionalProperties": False,
        "required": ["config", "metrics", "terminationGracePeriodSeconds"],
        "properties": {
            # Helm gives a subchart the parent's "global" values (and a condition's "enabled").
            "global": {"type": "object"},
            "enabled": {"type": "boolean"},
            "replicaCount": {"type": "integer", "minimum": 0},
            "strategy": {
                "type": "object",
                "description": "The Deployment's strategy: one pod at a time by default.",
                "additionalProperties": False,
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["RollingUpdate", "Recreate"]},
                    "rollingUpdate": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"maxSurge": _COUNT_OR_PERCENT, "maxUnavailable": _COUNT_OR_PERCENT},
                    },
                },
            },
            "minReadySeconds": {
                "type": "integer",
                "minimum": 0,
                "description": "Seconds a new pod stays ready before the next old one is stopped.",
            },
            "image": {
                "type": "object",
                "additionalProperties": False,
                "required": ["repository"],
                "properties": {
                    "repository": {"type": "string", "minLength": 1},
                    "tag": {"type": "string"},
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
            },
            "imagePullSecrets": {"type": "array", "items": {"type": "object"}},
            "config": _config_schema(settings, defs),
            "settings": settings_file,
            "extraEnv": {
                "type": "array",
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            },
            "serviceAccount": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "create": {"type": "boolean"},
                    "name": {"type": "string"},
                    "annotations": _STRING_MAP,
                },
            },
            "metrics": {
                "type": "object",
                "additionalProperties": False,
                "required": ["port"],
                "properties": {
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "serviceMonitor": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "enabled": {"type": "boolean"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "labels": _STRING_MAP,
                        },
                    },
                },
            },
            "prometheusRule": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "labels": _STRING_MAP,
                    "selector": {"type": "string"},
                    "lagThresholdSeconds": {"type": "number", "exclusiveMinimum": 0},
                    "subscriptionErrorsPerSecond": {"type": "number", "exclusiveMinimum": 0},
                    "poolFillRatio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                },
            },
            "grafanaDashboard": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"enabled": {"type": "boolean"}, "labels": _STRING_MAP, "annotations": _STRING_MAP},
            },
            "podSecurityContext": _kubernetes_object("The pod's securityContext."),
            "securityContext": _kubernetes_object("The container's securityContext."),
            "terminationGracePeriodSeconds": {
                "type": "integer",
                "minimum": 1,
                "description": "At least shutdown_timeout_s + 10 (checked at render).",
            },
            "resources": _kubernetes_object("The container's resources."),
            "tmpSizeLimit": {"type": ["string", "integer"]},
            "startupProbe": _PROBE,
            "livenessProbe": _PROBE,
            "readinessProbe": _PROBE,
            "cronJob": {
                "type": "object",
                "additionalProperties": False,
                "description": "A bounded run (efo run --until) on a schedule: a CronJob instead of the Deployment.",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "schedule": {"type": "string", "minLength": 1},
                    "timeZone": {"type": "string"},
                    "until": {"type": "string"},
                    "backoffLimit": {"type": "integer", "minimum": 0},
                    "activeDeadlineSeconds": {"type": ["integer", "null"], "minimum": 1},
                    "startingDeadlineSeconds": {"type": ["integer", "null"], "minimum": 0},
                    "successfulJobsHistoryLimit": {"type": "integer", "minimum": 0},
                    "failedJobsHistoryLimit": {"type": "integer", "minimum": 0},
                },
            },
            "doctor": {
                "type": "object",
                "additionalProperties": False,
                "description": "efo doctor as a Job of helm test, in the pod's place.",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "write": {"type": "boolean"},
                    "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                },
            },
            "podDisruptionBudget": _kubernetes_object("The spec of a PodDisruptionBudget; empty: none."),
            "nodeSelector": _STRING_MAP,
            "tolerations": {"type": "array"},
            "affinity": _kubernetes_object("The pod's affinity."),
            "podAnnotations": _STRING_MAP,
        },
        "definitions": defs,
    }


def render() -> str:
    text = json.dumps(values_schema(), indent=2, ensure_ascii=False) + "\n"
    # pydantic refers to sections as #/$defs/...; draft-07 validators (Helm's) resolve #/definitions/.
    return text.replace('"#/$defs/', '"#/definitions/')


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render())
    print(f"wrote {SCHEMA_PATH}")
