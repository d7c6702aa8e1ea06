"""Result tables and reports built from run summaries."""

from deepboot.report.schema import SUMMARY_SCHEMA, SummaryError, conform_summary
from deepboot.report.table import compare_table, format_value, summary_table, to_text

__all__ = [
    "SUMMARY_SCHEMA",
    "SummaryError",
    "compare_table",
    "conform_summary",
    "format_value",
    "summary_table",
    "to_text",
]
