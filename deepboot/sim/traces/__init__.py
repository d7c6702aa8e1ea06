"""Workloads from public production traces: inference streams beside the training traces.

Each loader reads one trace file row by row, validates every row it reads (an
:class:`~deepboot.core.errors.InputError` names the file, the 1-based line and the
column) and returns an :class:`~deepboot.sim.traces.common.InferenceStream`: requests
(one DeepBoot inference row each, ``application = infer-<service>``), the services they
name (:class:`~deepboot.core.service.ServiceSpec`) and the lines that credit the source.

* :mod:`~deepboot.sim.traces.genai`: Alibaba cluster-trace-v2026-GenAI (text-to-image
  requests per base model, measured base-model loads).
* :mod:`~deepboot.sim.traces.azure_llm`: Azure LLM inference trace 2023 (one hour of a
  conversation service, context and generated tokens per request).
* :mod:`~deepboot.sim.traces.rateshape`: the platform's diurnal rate shape from the
  GenAI trace's per-container QPS samples, as a ``time_s,rps`` rate profile.
* :mod:`~deepboot.sim.traces.compose`: a training workload plus inference streams,
  time-aligned and scaled to a peak busy fraction of the inference pool.

Both traces are under CC-BY-4.0: every file written from them carries the credit
(:data:`~deepboot.sim.traces.common.GENAI_SOURCE`,
:data:`~deepboot.sim.traces.common.AZURE_SOURCE`).
"""
