"""One job over several containers: node 0's supervisor leads, the others follow (nodes),
over a channel of JSON lines on TCP between them (channel). Imports ``base``, ``judge``
and ``home``; the supervisor builds a fleet node and hands it its outcomes.
"""
