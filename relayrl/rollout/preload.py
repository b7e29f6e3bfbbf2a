"""What the engines' fork server imports once (``forkserver.PRELOAD``): vLLM without Inductor's compiler
(``relayrl.vllm_import``: the server runs with Dynamo off, as the engines it forks do), then everything the
engine host (``relayrl.rollout.host``), the engine core and its worker import before they work."""

from relayrl.vllm_import import import_vllm

import_vllm()

import vllm.v1.engine.async_llm  # noqa: E402
import vllm.v1.engine.core  # noqa: E402
import vllm.v1.executor.multiproc_executor  # noqa: E402
import vllm.v1.worker.cpu_worker  # noqa: E402,F401

import relayrl.rollout.forkserver  # noqa: E402
import relayrl.rollout.host  # noqa: E402,F401
