"""Typed wire messages, grouped by the service that receives them.

- the records nested inside them, by meaning: `chat` (turns, tools, grammars), `images` (image files
  and the encoder's inputs), `parameters`
  (a request's generation parameters), `batches` (what the worker steps and reports), `events`
  (what the client is streamed).
- `peer`: registration and liveness, both directions on every ROUTER/DEALER link.
- `scheduler`: what the scheduler receives (from clients, tokenizers and workers).
- `tokenizer`: what a tokenizer receives (encode and detokenize jobs).
- `worker`: what a worker receives (TGI's verbs).
- `client`: what a client receives (stream events and query replies).
"""

# 13: images (`ContentPart`s in chat turns, markdown images in Generate, `EncodedImage`s in Encoded and
# WorkerRequest, `vision` in WorkerInfo);
# 12: LoRA adapters (`adapter_id` and `model` in the parameters, `AdapterRef` on WorkerRequest, LoadAdapter,
# UnloadAdapter and AdapterReply, the base's LoRA target shapes in WorkerInfo, the adapters in InfoReply);
# 11: a draining worker's grace period and the scheduler's `drained` on heartbeats;
# 10: embedding requests (`embed` in the parameters, Encoded and WorkerRequest; the pooled vector in
# Generation and FinalDetails; the pooling a worker serves in WorkerInfo and InfoReply);
# 9: token-id prompts in Generate, prompt positions' top tokens in Generation and FinalDetails, chats and
# ids (detokenize) in TokenizeQuery;
# 8: the KV window of an all-sliding model in WarmupResult; 7: several generations per request per step
# (speculation), proposed and accepted tokens in Timings; 6: job ids on detokenize jobs, the scheduler nonce on
# encode jobs, `registered` on heartbeats; 5: cached prompt tokens (prefix caching); 4: grammar in the
# parameters, tools and tool calls in chats; 3: paged KV blocks and prefill chunks; 2: presence_penalty
PROTOCOL_VERSION = 13

from ztgi.common.messages.batches import *  # noqa: E402,F401,F403
from ztgi.common.messages.chat import *  # noqa: E402,F401,F403
from ztgi.common.messages.client import *  # noqa: E402,F401,F403
from ztgi.common.messages.events import *  # noqa: E402,F401,F403
from ztgi.common.messages.images import *  # noqa: E402,F401,F403
from ztgi.common.messages.parameters import *  # noqa: E402,F401,F403
from ztgi.common.messages.peer import *  # noqa: E402,F401,F403
from ztgi.common.messages.scheduler import *  # noqa: E402,F401,F403
from ztgi.common.messages.tokenizer import *  # noqa: E402,F401,F403
from ztgi.common.messages.worker import *  # noqa: E402,F401,F403
