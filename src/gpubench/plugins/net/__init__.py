"""``gpubench net``: multi-stream TCP throughput between two hosts (server, client, local), UCX
bandwidth and latency (``--protocol ucx``), and under a launcher the node x node matrix. Its parts
stay inside: the wire protocol, the server, the streams and their worker processes, the fleet's
link step, the UCX engine and its server."""

from gpubench.core.plugin import Plugin, param, params_schema

PLUGIN = Plugin(
    name="net",
    help="Multi-stream TCP throughput between two hosts (server, client, local), or UCX (--protocol ucx).",
    command="gpubench.plugins.net.command",
    gpu="no",
    docs="docs/net.md",
    bench="gpubench.plugins.net.bench",
    more_samples="more intervals (net's samples are its intervals): a longer -t (seconds) or a shorter -i (interval)",
    added_options={"direction": "c2s", "window": 0, "bitrate": 0, "family": 0, "protocol": "tcp", "memory": "host"},
    added_params={"direction": "c2s", "protocol": "tcp", "memory": "host"},
    incidental_options=("port", "cport"),  # the server's and the streams' TCP ports
    matrix_ends="rank",  # the node x node test's src/dst: one rank per node
    suite_steps="gpubench.plugins.net.hooks:suite_steps",
    fleet_checks="gpubench.plugins.net.hooks:fleet_checks",
    fleet_stage="gpubench.plugins.net.hooks:fleet_stage",
    metrics="gpubench.plugins.net.hooks:metrics",
    params_schema=params_schema({
        "stream": param(["integer", "string"], "the TCP stream's index, \"total\" for their sum, or \"latency\" "
                        "(--protocol ucx --latency: one record per message size)"),
    }, {
        "streams": param("integer", "parallel TCP streams (-P)", minimum=1),
        "buffer_nbytes": param("integer", "bytes per send call (-l)", minimum=1),
        "direction": param("string", "c2s, s2c (-R), or one half of --bidir"),
        "src": param("integer", "the sending rank of a node x node test", minimum=0),
        "dst": param("integer", "the receiving rank of a node x node test", minimum=0),
        "protocol": param("string", "tcp or ucx (--protocol); absent in older results: tcp"),
        "memory": param("string", "the buffers: host (tcp, always), cuda, or SEND,RECV (-m); absent: host"),
        "api": param("string", "--protocol ucx: UCX's tag or stream API (--api)"),
        "nbytes": param("integer", "--protocol ucx --latency: the message size of the record, bytes", minimum=1),
    }),
)
