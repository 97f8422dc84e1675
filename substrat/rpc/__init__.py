"""How clients reach the daemon: the socket, the root's lock, JSON-RPC 2.0 and its server.

* :mod:`substrat.rpc.protocol`: framing, parsing and error codes (pure);
* :mod:`substrat.rpc.transport`: the Unix socket (path limits, permissions, peer uid);
* :mod:`substrat.rpc.lock`: the root's lock and clean-shutdown marker;
* :mod:`substrat.rpc.server`: connections, limits, dispatch, notifications;
* :mod:`substrat.rpc.methods`: the daemon's methods (docs/rpc.md).
"""
