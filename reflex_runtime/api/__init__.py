"""The request layer under every front end (`serve`, `stdio`/`uds`, handlers/app.py).

A transport only moves bytes; everything a request means is decided here, once:
- `json_wire`     bytes -> one JSON object (bounded: no NaN, no huge numbers, no deep nesting),
                  and objects -> bytes that always encode;
- `fields`        the field checkers every shape is validated with;
- `schema_bounds` JSON schemas bounded before the grammar engine (depth, size, $ref chains;
                  `schema_finite`: some finite value satisfies them);
- `client_watch`  clients that leave or stop reading, as socket front ends notice them;
- `direct_ops`    the direct shapes (`{"op": "generate" | "system1" | "ping" | "shutdown"}`) and
                  their dispatch, for JSON lines and Lambda direct invokes;
- `openai_mapping` the OpenAI chat/completions/system1/models bodies and responses;
- `http_routes`   the HTTP routes and the order every HTTP front end answers in;
- `auth`          the one Authorization grammar and its constant-time check;
- `model_state`   loading / ready / failed, health, and the 503 a failed load answers;
- `responses`     Response, and the error bodies: one shape per transport family.
Limits live on `engine.Limits` (one dataclass); the engine gets validated requests.
Nothing here is imported by the package: front ends import what they use.
"""
