"""Transports (TCP, ZeroMQ), the rendezvous and authentication."""
