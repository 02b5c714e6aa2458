#!/usr/bin/env python3
"""Opens N client connections to mongoguard, completes a hello on each, then holds them idle
for a while so the proxy's memory per idle client can be read from /proc/PID/status.

Usage: integration/.venv/bin/python bench/idle_clients.py N PORT SECONDS
"""
import socket, struct, sys, time, os
import bson  # from pymongo (integration/.venv)
N=int(sys.argv[1]); port=int(sys.argv[2])
def hello(i):
    body=bson.encode({"hello":1,"$db":"admin"})
    payload=struct.pack("<I",0)+b"\x00"+body
    return struct.pack("<iiii",16+len(payload),i,0,2013)+payload
socks=[]
for i in range(N):
    s=socket.create_connection(("127.0.0.1",port))
    s.sendall(hello(i+1))
    hdr=s.recv(16); n=struct.unpack("<i",hdr[:4])[0]; rest=n-16
    while rest>0: rest-=len(s.recv(rest))
    socks.append(s)
print("open",len(socks),flush=True)
time.sleep(float(sys.argv[3]))
