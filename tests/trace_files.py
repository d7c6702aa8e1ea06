"""Builders of small trace files in the layouts of ``../shared/traces/inference/`` (no
tests here): the tests write their own files and read the real ones only when present."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "inference"
"""The real traces, when this checkout sits beside ``../shared``."""
GENAI_DIR = REAL / "alibaba-genai-2026"
AZURE_DIR = REAL / "azure-llm-2023"

GENAI_HEADER = (
    "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,"
    "negative_prompt_length,num_images_per_prompt,num_inference_steps,"
    "checkpoint_model_version_id,num_lora"
)
LOAD_HEADER = "timestamp_anon,value,container_ip"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
QPS_HEADER = "timestamp_anon,value,container_ip,request_type"


def genai_row(
    when: str, status: str = "SUCCEED", exec_s: str = "23.0", model: str = "M0002"
) -> str:
    """One request row: the read columns as given, the others as in the real trace
    (an empty negative prompt length, as there)."""
    return f"{when},TXT_2_IMG,{status},{exec_s},G0001,93.0,,1.0,40.0,{model},0"


def write(path: Path, header: str, rows: Sequence[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def genai_file(path: Path, rows: Sequence[str]) -> Path:
    return write(path, GENAI_HEADER, rows)


def loads_file(path: Path, millis: Sequence[float]) -> Path:
    rows = [f"{1662859290.0 + 60 * i},{ms},c{i % 3}" for i, ms in enumerate(millis)]
    return write(path, LOAD_HEADER, rows)


def azure_file(path: Path, rows: Sequence[tuple[str, int, int]]) -> Path:
    return write(path, AZURE_HEADER, [f"{t},{c},{g}" for t, c, g in rows])


def qps_file(path: Path, rows: Sequence[tuple[float, float, str]]) -> Path:
    """Rows of (time, value, request type); the container id is left empty for API rows,
    as in the real file."""
    lines = [f"{t},{v},{'' if kind == 'API Requests' else 'c0'},{kind}" for t, v, kind in rows]
    return write(path, QPS_HEADER, lines)


def day_of_requests(path: Path) -> Path:
    """A small GenAI trace: a quiet day, a busy burst on the second, every status."""
    rows = [genai_row(f"2024-11-15 {h:02d}:00:00", model="M0001") for h in range(0, 24, 4)]
    rows += [
        genai_row(f"2024-11-16 10:{m:02d}:00", model=("M0002", "M0003", "M0004")[m % 3])
        for m in range(0, 60, 2)
    ]
    rows += [
        genai_row("2024-11-16 11:00:00", "FAILED", "3.0", "M0002"),
        genai_row("2024-11-16 11:01:00", "PENDING", "0.0", ""),
        genai_row("2024-11-16 11:02:00", "PENDING", "0.0", "M0002"),
        genai_row("2024-11-16 11:03:00", "PROCESSING", "40.0", "M0003"),
    ]
    return genai_file(path, rows)
