"""The job's owner, proven by MUNGE, sees the evidence text of their own jobs.

`sattrib JOBID` on a login node asks for a diagnosis with a credential it made with `munge`
(the cluster's own authentication, the one Slurm uses), its payload the diagnosis it asks for;
`unmunge` here says which uid made it. munged refuses a credential decoded twice or older than
its time to live (300 s unless the site changed it), and the payload binds it to one diagnosis,
so a copied credential opens nothing. The owner gets their own job's lines and frames, never
another job's; nobody gets more than that this way (admins are named by the site's proxy)."""
import asyncio
import os
import pwd
import re

from sattrib.remote import munge_payload
from sattrib.serve import MUNGE_ENV, OWNER_ENV      # how `sattrib serve` hands them over

HEADER = "x-sattrib-munge"          # the credential, as `munge` prints it
MAX_CREDENTIAL = 4096
UNMUNGE_TIMEOUT_S = 5.0
UID = re.compile(rb"^UID:\s+\S*\s*\((\d+)\)\s*$", re.M)
STATUS_OK = re.compile(rb"^STATUS:\s+Success \(0\)\s*$", re.M)


async def proven_uid(request, did: str):
    """The uid whose credential came with this request for diagnosis `did`, or None: no
    credential, MUNGE refused it (forged, replayed, expired), or it names another diagnosis."""
    cred = request.headers.get(HEADER, "").strip()
    if not cred or len(cred) > MAX_CREDENTIAL or not os.environ.get(OWNER_ENV):
        return None
    argv = ["unmunge"]
    if os.environ.get(MUNGE_ENV):
        argv += ["--socket", os.environ[MUNGE_ENV]]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return None                                  # no unmunge on this host
    try:
        out, _ = await asyncio.wait_for(proc.communicate(cred.encode("ascii", "replace")),
                                        UNMUNGE_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        return None
    head, _, body = out.partition(b"\n\n")
    m = UID.search(head)
    if proc.returncode != 0 or not STATUS_OK.search(head) or not m:
        return None
    if body.rstrip(b"\n") != munge_payload(did).encode():
        return None
    return int(m.group(1))


async def is_owner(request, did: str, user) -> bool:
    """Did the job's own user (its name in the diagnosis) send this request for it?"""
    if not user or not request.headers.get(HEADER):
        return False
    uid = await proven_uid(request, did)
    if uid is None or uid == 0:
        return False
    try:
        return pwd.getpwuid(uid).pw_name == user
    except KeyError:
        return False
