"""Durable rendezvous state: the key-value interface and its stores (memory, etcd), the job
record, the write-ahead journal, leadership and agent leases."""
