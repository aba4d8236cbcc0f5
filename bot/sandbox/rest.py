"""GitHub's REST routes the bot uses, answered from the sandbox state (the issue routes
are in `rest_issues.py`, the route table with each route's permission in `routes.py`).

Each handler takes a `Call` and answers a `Reply` (or raises `ApiError`); the edge in
`api.py` adds authentication, permissions, faults, rate limits, ETags, pagination and the
log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from multidict import MultiMapping

from bot.sandbox.events import Payloads
from bot.sandbox.gate import SUSPENDED, ApiError
from bot.sandbox.patches import blob_sha
from bot.sandbox.permissions import METADATA_READ, Needs, covers, grants
from bot.sandbox.shapes import BOT_LOGIN, Shapes, folder_sha, ts
from bot.sandbox.state import (
    Artifact,
    CheckRun,
    Dispatch,
    RepoState,
    WorkflowRun,
    workflow_display_name,
    workflow_run_title,
    workflow_trigger,
)
from bot.sandbox.world import Event, World

MAX_PULL_FILES = 3000
MAX_COMPARE_FILES = 300
LARGE_FILE = 1024 * 1024
CONTENTS_LISTING_MAX = 1000
# A run listing filtered by any of these is a search, and a search lists at most RUN_SEARCH_MAX.
RUN_SEARCH_PARAMS = ("actor", "branch", "check_suite_id", "created", "event", "head_sha", "status")
RUN_SEARCH_MAX = 1000
CHECK_STATUSES = ("queued", "in_progress", "completed", "waiting", "requested", "pending")
ACTIONS_ONLY_STATUSES = ("waiting", "requested", "pending")
CHECK_CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success",
                     "skipped", "stale", "timed_out")
# Route parameters that may contain slashes.
GREEDY = {"path", "ref", "basehead"}


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    items: list[Any] | None = None  # a list to paginate
    wrap: str | None = None  # key of the paginated list inside an object
    extra: dict[str, Any] = field(default_factory=dict)  # other keys of that object
    total: int | None = None  # its total_count, when that counts more than `items` (a capped search)
    # Turns an item of `items` into its JSON, for the listed page alone: a busy repository's
    # thousand runs are not all shaped to answer one page of them.
    shape: Callable[[Any], Any] | None = None
    raw: bytes | None = None
    content_type: str = "application/json"


@dataclass
class Call:
    world: World
    shapes: Shapes
    params: dict[str, str]
    query: MultiMapping[str]
    body: Any
    accept: str
    installation_id: int | None
    origin: str
    token: str | None = None
    announce: list[Event] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.world.now()

    def repo(self) -> RepoState:
        repo = self.world.repo_named(self.params)
        if repo is None or not self.world.app_sees(repo, self.installation_id):
            raise ApiError(404, "Not Found")
        return repo

    def require(self, repo: RepoState, needs: Needs) -> None:
        """403 unless this request's permissions in `repo` grant `needs`."""
        if not grants(self.world.permissions_for(self.token, repo), needs):
            raise forbidden(needs)

    def number(self, name: str) -> int:
        try:
            return int(self.params[name])
        except ValueError:
            raise ApiError(404, "Not Found") from None

    def field(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None


Handler = Callable[[Call], Reply]


def forbidden(needs: Needs) -> ApiError:
    """GitHub's answer to a request its installation may not make; the header names the
    permissions that would have granted it (alternatives separated by `; `)."""
    accepted = "; ".join(f"{name}={level}" for name, level in needs)
    return ApiError(403, "Resource not accessible by integration",
                    {"x-accepted-github-permissions": accepted})


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    handler: Handler
    needs: Needs


class Router:
    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, template: str, handler: Handler, needs: Needs) -> None:
        def group(match: re.Match[str]) -> str:
            name = match.group(1)
            return f"(?P<{name}>.+)" if name in GREEDY else f"(?P<{name}>[^/]+)"

        pattern = re.compile("^" + re.sub(r"\{(\w+)\}", group, template) + "$")
        self.routes.append(Route(method, template, pattern, handler, needs))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            found = route.pattern.match(path)
            if route.method == method and found:
                return route, found.groupdict()
        return None


def validation_failed(message: str, **extra: Any) -> ApiError:
    return ApiError(422, message, **extra)


# --- the App and its installations -----------------------------------------------------


def create_token(call: Call) -> Reply:
    """An installation token, with the installation's permissions or the fewer asked for."""
    installation_id = call.number("installation_id")
    if not call.world.installations().get(installation_id):
        raise ApiError(404, "Not Found")
    if installation_id in call.world.suspended:
        raise ApiError(403, SUSPENDED)
    granted = call.world.installation(installation_id).permissions
    wanted = call.field("permissions")
    if wanted is None:
        wanted = granted
    elif not isinstance(wanted, dict) or not covers(granted, wanted):
        raise validation_failed("The permissions requested are not granted to this installation.")
    token, made = call.world.issue_token(installation_id, dict(wanted))
    return Reply(201, {"token": token, "expires_at": ts(made.expires_at),
                       "permissions": dict(made.permissions),
                       "repository_selection": "selected"})


def get_app(call: Call) -> Reply:
    return Reply(body=call.shapes.app())


def list_installations(call: Call) -> Reply:
    grouped = call.world.installations()
    return Reply(items=[call.world.installation_shape(call.shapes, grouped[i][0]) for i in sorted(grouped)])


def repo_installation(call: Call) -> Reply:
    return Reply(body=call.world.installation_shape(call.shapes, call.repo()))


def installation_repositories(call: Call) -> Reply:
    repos = [r for r in call.world.repos.values() if call.world.app_sees(r, call.installation_id)]
    return Reply(items=[call.shapes.repository(r) for r in repos], wrap="repositories",
                 extra={"repository_selection": "selected"})


def get_repository(call: Call) -> Reply:
    return Reply(body=call.shapes.repository(call.repo()))


ACTIVITY_TYPES = ("push", "force_push", "branch_creation", "branch_deletion", "pr_merge", "merge_queue_merge")


def list_activity(call: Call) -> Reply:
    """The repository's activity, newest first (`direction=asc`: oldest): the moves of its
    branches Klaud's sandbox makes (pushes, force pushes, merges of pull requests; not
    refs written through the REST API), filtered by `ref` (a branch's name or full ref)
    and `activity_type`. As on GitHub, a type or direction it does not know is a 422."""
    repo = call.repo()
    kind, direction = call.query.get("activity_type"), call.query.get("direction", "desc")
    if kind is not None and kind not in ACTIVITY_TYPES:
        raise validation_failed(f"activity_type must be one of {', '.join(ACTIVITY_TYPES)}")
    if direction not in ("asc", "desc"):
        raise validation_failed("direction must be asc or desc")
    moves = list(repo.moves)
    ref = call.query.get("ref")
    if ref:
        full = ref if ref.startswith("refs/") else f"refs/heads/{ref}"
        moves = [move for move in moves if move.ref == full]
    if kind is not None:
        moves = [move for move in moves if move.kind == kind]
    if direction == "desc":
        moves.reverse()
    return Reply(items=[call.shapes.activity(move) for move in moves])


def get_repository_by_id(call: Call) -> Reply:
    """A repository by the id that stays through renames and transfers."""
    found = call.world.repo_by_id(call.number("repository_id"))
    if found is None or not call.world.app_sees(found, call.installation_id):
        raise ApiError(404, "Not Found")
    call.require(found, METADATA_READ)
    return Reply(body=call.shapes.repository(found))


# --- contents, commits, compare, refs --------------------------------------------------


def resolve_or_404(repo: RepoState, ref: str) -> str:
    sha = repo.resolve(ref)
    if sha is None:
        raise ApiError(404, "Not Found")
    return sha


def get_contents(call: Call) -> Reply:
    repo = call.repo()
    ref = call.query.get("ref") or repo.default_branch
    sha = repo.resolve(ref)
    if sha is None:
        raise ApiError(404, f"No commit found for the ref {ref}")
    tree = repo.commits[sha].tree
    path = call.params.get("path", "").strip("/")
    if path in tree:
        text = tree[path]
        # One ETag for both forms of a file, as GitHub gives (and answers either's
        # If-None-Match with 304): a client keying its cache by URL alone gets the wrong form.
        same = {"etag": 'W/"' + hashlib.sha1(text.encode("utf-8")).hexdigest() + '"'}
        if "raw" in call.accept:
            return Reply(raw=text.encode("utf-8"), content_type="application/vnd.github.raw", headers=same)
        return Reply(body=file_content(call.shapes, repo, path, text, ref), headers=same)
    prefix = f"{path}/" if path else ""
    children = sorted({p[len(prefix):].split("/")[0] for p in tree if p.startswith(prefix)})
    if not children:
        raise ApiError(404, "Not Found")
    listing = []
    # GitHub lists a folder's first 1,000 entries and says nothing of the others (its
    # documentation sends larger folders to the Git Trees API).
    for name in children[:CONTENTS_LISTING_MAX]:
        child = prefix + name
        if child in tree:
            listing.append(call.shapes.content_entry(
                repo, child, ref, "file", blob_sha(tree[child]), len(tree[child].encode())))
        else:
            listing.append(call.shapes.content_entry(repo, child, ref, "dir", named_tree(repo, sha, child), 0))
    return Reply(body=listing)


def file_content(shapes: Shapes, repo: RepoState, path: str, text: str, ref: str) -> dict[str, Any]:
    data = text.encode("utf-8")
    entry = shapes.content_entry(repo, path, ref, "file", blob_sha(text), len(data))
    if len(data) > LARGE_FILE:
        # GitHub leaves out the content of files over 1 MB; the raw media type still works.
        return {**entry, "content": "", "encoding": "none"}
    encoded = base64.b64encode(data).decode("ascii")
    wrapped = "\n".join(encoded[i:i + 60] for i in range(0, len(encoded), 60))
    return {**entry, "content": wrapped + ("\n" if wrapped else ""), "encoding": "base64"}


def get_commit(call: Call) -> Reply:
    repo = call.repo()
    ref = call.params["ref"]
    sha = repo.resolve(ref)
    if sha is None:
        raise validation_failed(f"No commit found for SHA: {ref}")
    commit = repo.commits[sha]
    parent = repo.commits.get(commit.parents[0]) if commit.parents else None
    files = repo.diff_trees(parent.tree if parent else {}, commit.tree)
    return Reply(body=call.shapes.commit(repo, commit, files))


def compare(call: Call) -> Reply:
    repo = call.repo()
    base_ref, sep, head_ref = call.params["basehead"].partition("...")
    if not sep:
        raise ApiError(404, "Not Found")
    base = resolve_or_404(repo, base_ref.split(":")[-1])
    head = resolve_or_404(repo, head_ref.split(":")[-1])
    base_line, head_line = repo.ancestors(base), repo.ancestors(head)
    base_set, head_set = set(base_line), set(head_line)
    ahead = [sha for sha in head_line if sha not in base_set]
    behind = [sha for sha in base_line if sha not in head_set]
    if base == head:
        status = "identical"
    elif not behind:
        status = "ahead"
    elif not ahead:
        status = "behind"
    else:
        status = "diverged"
    merge_base = repo.merge_base(base, head)
    if merge_base is None:  # GitHub: "No common ancestor between ..." (unrelated histories)
        raise ApiError(404, f"No common ancestor between {base_ref} and {head_ref}.")
    files = repo.diff_trees(repo.commits[merge_base].tree, repo.commits[head].tree)
    web = f"{call.shapes.web}/{repo.full_name}"
    commits = sorted((repo.commits[sha] for sha in ahead), key=lambda c: c.seq)
    return Reply(body={
        "url": f"{call.shapes.api}/repos/{repo.full_name}/compare/{base_ref}...{head_ref}",
        "html_url": f"{web}/compare/{base_ref}...{head_ref}",
        "permalink_url": f"{web}/compare/{repo.owner}:{base}...{repo.owner}:{head}",
        "diff_url": f"{web}/compare/{base_ref}...{head_ref}.diff",
        "patch_url": f"{web}/compare/{base_ref}...{head_ref}.patch",
        "base_commit": call.shapes.commit(repo, repo.commits[base]),
        "merge_base_commit": call.shapes.commit(repo, repo.commits[merge_base]),
        "status": status,
        "ahead_by": len(ahead),
        "behind_by": len(behind),
        "total_commits": len(ahead),
        "commits": [call.shapes.commit(repo, c) for c in commits],
        "files": [call.shapes.pull_file(repo, f, head) for f in files[:MAX_COMPARE_FILES]],
    })


def get_tree(call: Call) -> Reply:
    """A tree named by a commit, a ref or its own id (a folder's, from a listing)."""
    repo = call.repo()
    commit, folder = found_tree(repo, call.params["tree_sha"])
    tree = repo.commits[commit].tree
    prefix = f"{folder}/" if folder else ""
    held = {path[len(prefix):]: text for path, text in tree.items() if path.startswith(prefix)}
    # GitHub: "setting this parameter to any value returns the objects or subtrees" (0 and
    # false included).
    recursive = "recursive" in call.query
    paths = sorted(held) if recursive else sorted({p.split("/")[0] for p in held})
    entries = []
    for path in paths:
        if path in held:
            entries.append({"path": path, "mode": "100644", "type": "blob", "sha": blob_sha(held[path]),
                            "size": len(held[path].encode())})
        else:
            entries.append({"path": path, "mode": "040000", "type": "tree", "sha": named_tree(repo, commit, prefix + path)})
    if recursive:
        directories = sorted({"/".join(p.split("/")[:i]) for p in held
                              for i in range(1, p.count("/") + 1)})
        entries += [{"path": d, "mode": "040000", "type": "tree", "sha": named_tree(repo, commit, prefix + d)}
                    for d in directories]
        entries.sort(key=entry_path)
    sha = folder_sha(tree, folder)
    return Reply(body={"sha": sha, "url": f"{call.shapes.api}/repos/{repo.full_name}/git/trees/{sha}",
                       "tree": entries, "truncated": False})


def named_tree(repo: RepoState, commit: str, folder: str) -> str:
    """The tree id of `folder` at `commit`, remembered as named (see `found_tree`)."""
    sha = folder_sha(repo.commits[commit].tree, folder)
    repo.trees.setdefault(sha, (commit, folder))
    return sha


def found_tree(repo: RepoState, name: str) -> tuple[str, str]:
    """(the commit, the folder) of the tree `name` names: a commit or ref (its root), a
    folder's tree a listing named, or a commit's root tree by its id; 404 otherwise."""
    if (sha := repo.resolve(name)) is not None:
        return sha, ""
    if name in repo.trees:
        return repo.trees[name]
    for commit in reversed(repo.commits.values()):  # the newest are asked for most
        if folder_sha(commit.tree, "") == name:
            return commit.sha, ""
    raise ApiError(404, "Not Found")


def entry_path(entry: dict[str, Any]) -> str:
    path: str = entry["path"]
    return path


def full_ref(ref: str) -> str:
    return ref if ref.startswith("refs/") else f"refs/{ref}"


def get_ref(call: Call) -> Reply:
    repo = call.repo()
    name = full_ref(call.params["ref"])
    if name not in repo.refs:
        raise ApiError(404, "Not Found")
    return Reply(body=call.shapes.ref(repo, name, repo.refs[name]))


def matching_refs(call: Call) -> Reply:
    repo = call.repo()
    prefix = full_ref(call.params["ref"])
    return Reply(body=[call.shapes.ref(repo, name, sha)
                       for name, sha in sorted(repo.refs.items()) if name.startswith(prefix)])


def create_ref(call: Call) -> Reply:
    repo = call.repo()
    name, sha = call.field("ref"), call.field("sha")
    if not isinstance(name, str) or not isinstance(sha, str):
        raise validation_failed('Invalid request. "ref" and "sha" are required.')
    if not name.startswith("refs/") or name.count("/") < 2:
        raise validation_failed("Reference name must start with 'refs/' and have at least two slashes.")
    if sha not in repo.commits:
        raise validation_failed("Object does not exist")
    if name in repo.refs:
        raise validation_failed("Reference already exists")
    if any(other.startswith(name + "/") or name.startswith(other + "/") for other in repo.refs):
        # git keeps refs as paths: `refs/heads/a` leaves no room for `refs/heads/a/b`.
        raise validation_failed("Reference update failed")
    repo.refs[name] = sha
    # GitHub sends a push for a branch made through the API too (Klaud gets its claims back).
    call.announce.append(Payloads(call.world).push(repo, None, repo.commits[sha], BOT_LOGIN, ref=name))
    made = call.shapes.ref(repo, name, sha)
    return Reply(201, made, headers={"location": made["url"]})


def update_ref(call: Call) -> Reply:
    repo = call.repo()
    name = full_ref(call.params["ref"])
    sha = call.field("sha")
    if name not in repo.refs:
        raise validation_failed("Reference does not exist")
    if not isinstance(sha, str) or sha not in repo.commits:
        raise validation_failed("Object does not exist")
    if not call.field("force") and repo.refs[name] not in repo.ancestors(sha):
        raise validation_failed("Update is not a fast forward")
    before, repo.refs[name] = repo.refs[name], sha
    if before != sha:
        call.announce.append(Payloads(call.world).push(repo, repo.commits[before], repo.commits[sha], BOT_LOGIN, ref=name))
    return Reply(body=call.shapes.ref(repo, name, sha))


def delete_ref(call: Call) -> Reply:
    repo = call.repo()
    name = full_ref(call.params["ref"])
    if name not in repo.refs:
        raise validation_failed("Reference does not exist")
    if name == repo.default_ref:
        raise validation_failed("Cannot delete the default branch")
    call.announce.append(Payloads(call.world).push(repo, repo.commits[repo.refs.pop(name)], None, BOT_LOGIN, ref=name))
    return Reply(204)


# --- pull requests ---------------------------------------------------------------------


def list_pulls(call: Call) -> Reply:
    repo = call.repo()
    state = call.query.get("state", "open")
    head = call.query.get("head")
    base = call.query.get("base")
    pulls = [p for p in repo.pulls.values() if state == "all" or p.state == state]
    if head:
        owner, _, branch = head.partition(":")
        pulls = [p for p in pulls
                 if owner.lower() == (p.head_owner or repo.owner).lower() and p.head_ref == (branch or owner)]
    if base:
        pulls = [p for p in pulls if p.base_ref == base]
    sort = call.query.get("sort", "created")
    direction = call.query.get("direction", "desc" if sort == "created" else "asc")
    key = {"updated": lambda p: (p.updated_at, p.number)}.get(
        sort, lambda p: (p.created_at, p.number))
    pulls.sort(key=key, reverse=direction == "desc")
    return Reply(items=[call.shapes.pull_request(repo, p, full=False) for p in pulls])


def get_pull(call: Call) -> Reply:
    repo = call.repo()
    pull = repo.pulls.get(call.number("pull_number"))
    if pull is None:
        raise ApiError(404, "Not Found")
    return Reply(body=call.shapes.pull_request(repo, pull))


def pull_files(call: Call) -> Reply:
    repo = call.repo()
    pull = repo.pulls.get(call.number("pull_number"))
    if pull is None:
        raise ApiError(404, "Not Found")
    files = pull.files[:MAX_PULL_FILES]
    return Reply(items=[call.shapes.pull_file(repo, f, pull.head_sha) for f in files])


# --- actions ---------------------------------------------------------------------------


def created_filter(text: str) -> Callable[[datetime], bool]:
    """GitHub's `created` search syntax: DATE, >=DATE, <=DATE, >DATE, <DATE, A..B (`*` open)."""
    lower: datetime | None
    upper: datetime | None
    if ".." in text:
        low, high = text.split("..", 1)
        lower = None if low == "*" else parse_when(low)[0]
        upper = None if high == "*" else parse_when(high)[1]
    elif text.startswith(">="):
        lower, upper = parse_when(text[2:])[0], None
    elif text.startswith("<="):
        lower, upper = None, parse_when(text[2:])[1]
    elif text.startswith(">"):
        lower, upper = parse_when(text[1:])[1], None
    elif text.startswith("<"):
        lower, upper = None, parse_when(text[1:])[0]
    else:
        lower, upper = parse_when(text)
    return lambda t: (lower is None or t >= lower) and (upper is None or t < upper)


def parse_when(value: str) -> tuple[datetime, datetime]:
    """[start, end) of a date (a whole day) or of an instant."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            day = datetime.fromisoformat(value).replace(tzinfo=UTC)
            return day, day + timedelta(days=1)
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise validation_failed(f"Invalid created filter: {value}") from None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant, instant + timedelta(seconds=1)


def filtered_runs(call: Call, runs: list[WorkflowRun]) -> list[WorkflowRun]:
    query = call.query
    if "status" in query:
        runs = [r for r in runs if query["status"] in (r.status, r.conclusion)]
    if "created" in query:
        keep = created_filter(query["created"])
        runs = [r for r in runs if keep(r.created_at)]
    for name, attribute in (("event", "event"), ("branch", "head_branch"),
                            ("head_sha", "head_sha"), ("actor", "actor")):
        if name in query:
            runs = [r for r in runs if getattr(r, attribute) == query[name]]
    return sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)


def run_listing(call: Call, repo: RepoState, runs: list[WorkflowRun]) -> Reply:
    """GitHub: "This endpoint will return up to 1,000 results for each search when using the
    following parameters: actor, branch, check_suite_id, created, event, head_sha, status."
    Its total_count still counts every match (3,256 with page 11 of 100 empty, as measured
    in max-sixty/tend#887)."""
    listed = runs[:RUN_SEARCH_MAX] if any(name in call.query for name in RUN_SEARCH_PARAMS) else runs
    return Reply(items=listed, wrap="workflow_runs", total=len(runs),
                 shape=lambda run: call.shapes.workflow_run(repo, run))


def list_runs(call: Call) -> Reply:
    repo = call.repo()
    return run_listing(call, repo, filtered_runs(call, list(repo.runs.values())))


def workflow_runs(call: Call) -> Reply:
    repo = call.repo()
    workflow = repo.workflow_by_id_or_name(call.params["workflow_id"])
    if workflow is None:
        raise ApiError(404, "Not Found")
    return run_listing(call, repo, filtered_runs(call, [r for r in repo.runs.values() if r.workflow == workflow]))


def run_or_404(call: Call, repo: RepoState) -> WorkflowRun:
    run = repo.runs.get(call.number("run_id"))
    if run is None:
        raise ApiError(404, "Not Found")
    return run


def get_run(call: Call) -> Reply:
    repo = call.repo()
    return Reply(body=call.shapes.workflow_run(repo, run_or_404(call, repo)))


def run_jobs(call: Call) -> Reply:
    """The jobs of the run's latest attempt (the sandbox keeps no older ones)."""
    repo = call.repo()
    run = run_or_404(call, repo)
    return Reply(items=[call.shapes.job(repo, run, job) for job in run.jobs], wrap="jobs")


def artifact_list(call: Call, repo: RepoState, runs: list[WorkflowRun]) -> Reply:
    name = call.query.get("name")
    shaped = [call.shapes.artifact(repo, a, run, call.now)
              for run in runs for a in sorted(run.artifacts, key=lambda a: -a.id)
              if name is None or a.name == name]
    return Reply(items=shaped, wrap="artifacts")


def run_artifacts(call: Call) -> Reply:
    repo = call.repo()
    return artifact_list(call, repo, [run_or_404(call, repo)])


def repo_artifacts(call: Call) -> Reply:
    repo = call.repo()
    runs = sorted(repo.runs.values(), key=lambda r: r.id, reverse=True)
    return artifact_list(call, repo, runs)


def artifact_or_404(call: Call, repo: RepoState) -> tuple[Artifact, WorkflowRun]:
    artifact = repo.artifact(call.number("artifact_id"))
    if artifact is None:
        raise ApiError(404, "Not Found")
    return artifact, repo.runs[artifact.run_id]


def get_artifact(call: Call) -> Reply:
    repo = call.repo()
    artifact, run = artifact_or_404(call, repo)
    return Reply(body=call.shapes.artifact(repo, artifact, run, call.now))


def download_artifact(call: Call) -> Reply:
    repo = call.repo()
    artifact, _ = artifact_or_404(call, repo)
    if call.params["archive_format"] != "zip":
        raise ApiError(404, "Not Found")
    if artifact.expired(call.now):
        raise ApiError(410, "Artifact has expired")  # GitHub: 410 Gone
    name = call.world.register_blob(artifact.data)
    return Reply(302, None, headers={"location": f"{call.origin}/_sandbox/blobs/{name}"})


def dispatch_workflow(call: Call) -> Reply:
    repo = call.repo()
    ref = call.field("ref")
    if not isinstance(ref, str) or not ref:
        raise validation_failed('Invalid request.\n\n"ref" wasn\'t supplied.')
    # A branch or a tag: GitHub answers a commit SHA with the same 422.
    names = (ref,) if ref.startswith(("refs/heads/", "refs/tags/")) else (f"refs/heads/{ref}", f"refs/tags/{ref}")
    sha = next((repo.refs[name] for name in names if name in repo.refs), None)
    if sha is None:
        raise validation_failed(f"No ref found for: {ref}")
    workflow, text = dispatched_workflow(repo, sha, call.params["workflow_id"])
    trigger = workflow_trigger(text)
    if trigger is None:
        raise validation_failed("Workflow does not have 'workflow_dispatch' trigger")
    inputs = call.field("inputs") or {}
    if not isinstance(inputs, dict):
        raise validation_failed("Invalid request.\n\nFor 'properties/inputs', is not an object.")
    check_inputs(trigger, inputs)
    details = wants_run_details(call)
    run = queue_dispatched_run(call, repo, workflow, text, sha, ref, inputs)
    if not details:
        return Reply(204)
    shaped = call.shapes.workflow_run(repo, run)
    return Reply(200, {"workflow_run_id": run.id, "run_url": shaped["url"],
                       "html_url": shaped["html_url"]})


def dispatched_workflow(repo: RepoState, sha: str, key: str) -> tuple[str, str]:
    """The workflow file (by name or id) as it is on the dispatched commit, and its text."""
    tree = repo.commits[sha].tree
    for workflow in repo.workflow_files():
        path = f".github/workflows/{workflow}"
        if path in tree and key in (workflow, str(repo.workflow_id(workflow))):
            return workflow, tree[path]
    raise ApiError(404, "Not Found")


def wants_run_details(call: Call) -> bool:
    details = call.field("return_run_details")
    if details is not None and not isinstance(details, bool):
        raise validation_failed(
            f"Invalid request.\n\nFor 'properties/return_run_details', {json.dumps(details)} "
            "is not a boolean.")
    return bool(details)


def queue_dispatched_run(call: Call, repo: RepoState, workflow: str, text: str, sha: str,
                         ref: str, inputs: dict[str, Any]) -> WorkflowRun:
    now = call.now
    run = WorkflowRun(
        id=call.world.ids.next("run"), workflow=workflow,
        name=workflow_display_name(workflow, text), head_sha=sha,
        head_branch=ref.removeprefix("refs/heads/"), event="workflow_dispatch",
        status="queued", conclusion=None, run_attempt=1,
        run_number=repo.next_run_number(workflow), actor=BOT_LOGIN,
        display_title=workflow_run_title(workflow, text, inputs), pull_requests=[],
        created_at=now, updated_at=now, run_started_at=now,
    )
    repo.runs[run.id] = run
    repo.dispatches.append(Dispatch(workflow, ref, dict(inputs), now, run.id))
    call.announce.append(Payloads(call.world).workflow_run(repo, run, "requested"))
    return run


def check_inputs(trigger: dict[str, Any], inputs: dict[str, Any]) -> None:
    declared = trigger.get("inputs") or {}
    unexpected = sorted(set(inputs) - set(declared))
    if unexpected:
        raise validation_failed(f"Unexpected inputs provided: {json.dumps(unexpected)}")
    for name, spec in declared.items():
        if not isinstance(spec, dict):
            continue
        if name in inputs:
            check_allowed_value(name, spec, inputs[name])
        elif spec.get("required") and spec.get("default") is None:
            raise validation_failed(f"Required input '{name}' not provided")


def check_allowed_value(name: str, spec: dict[str, Any], value: Any) -> None:
    """GitHub refuses a `choice` input's value outside its `options`, and a `boolean` one
    other than true or false (cli/cli#5246: "Provided value '' for input 'debug' not in the
    list of allowed values"). A `number` input is not checked: no source says GitHub refuses
    a value that is not a number."""
    if spec.get("type") == "choice":
        allowed = [str(option) for option in spec.get("options") or []]
    elif spec.get("type") == "boolean":
        allowed = ["true", "false"]
    else:
        return
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    if text not in allowed:
        raise validation_failed(f"Provided value '{text}' for input '{name}' not in the list of allowed values")


# --- check runs ------------------------------------------------------------------------


# GitHub refuses a check-run output summary or text longer than this many UTF-8 bytes (422).
CHECK_OUTPUT_MAX_BYTES = 65_535


def apply_check_fields(call: Call, check: CheckRun) -> None:
    status, conclusion = call.field("status"), call.field("conclusion")
    if status is not None and status not in CHECK_STATUSES:
        raise validation_failed(f"Invalid status: {status}")
    if status in ACTIONS_ONLY_STATUSES:
        raise validation_failed(f"Only GitHub Actions can set a status of {status}")
    if conclusion is not None and conclusion not in CHECK_CONCLUSIONS:
        raise validation_failed(f"Invalid conclusion: {conclusion}")
    if conclusion == "stale":
        raise validation_failed("Only GitHub can set a conclusion of stale")
    if status == "completed" and conclusion is None and check.conclusion is None:
        raise validation_failed("Conclusion must be given when the status is completed")
    output = call.field("output")
    if output is not None:
        if not isinstance(output, dict) or not output.get("summary") or not output.get("title"):
            raise validation_failed("Invalid request.\n\n\"title\" and \"summary\" are required in \"output\".")
        for name in ("summary", "text"):
            if len(str(output.get(name) or "").encode("utf-8")) > CHECK_OUTPUT_MAX_BYTES:
                raise validation_failed(f"{name} exceeds a maximum bytesize of {CHECK_OUTPUT_MAX_BYTES}")
        check.output = dict(output)
    for name in ("name", "details_url", "external_id"):
        if isinstance(call.field(name), str):
            setattr(check, name, call.field(name))
    if status is not None:
        check.status = status
        if status != "completed":
            check.conclusion, check.completed_at = None, None  # back in progress: no conclusion
    if conclusion is not None:
        check.conclusion, check.status = conclusion, "completed"
    if check.status == "completed" and check.completed_at is None:
        check.completed_at = call.now


def create_check_run(call: Call) -> Reply:
    repo = call.repo()
    name, head_sha = call.field("name"), call.field("head_sha")
    if not isinstance(name, str) or not name or not isinstance(head_sha, str):
        raise validation_failed('Invalid request.\n\n"name" and "head_sha" are required.')
    if head_sha not in repo.commits:
        raise validation_failed(f"No commit found for SHA: {head_sha}")
    # One suite per commit holds all of the App's check runs on it, as on GitHub.
    suite = next((c.check_suite_id for c in repo.check_runs.values() if c.head_sha == head_sha),
                 None) or call.world.ids.next("check_suite")
    check = CheckRun(
        id=call.world.ids.next("check_run"), name=name, head_sha=head_sha, status="queued",
        conclusion=None, started_at=call.now, completed_at=None,
        output={}, details_url=None, external_id="", check_suite_id=suite,
    )
    apply_check_fields(call, check)
    repo.check_runs[check.id] = check
    call.announce.append(Payloads(call.world).check_run(repo, check, "created", BOT_LOGIN))
    return Reply(201, call.shapes.check_run(repo, check))


def check_or_404(call: Call, repo: RepoState) -> CheckRun:
    check = repo.check_runs.get(call.number("check_run_id"))
    if check is None:
        raise ApiError(404, "Not Found")
    return check


def update_check_run(call: Call) -> Reply:
    repo = call.repo()
    check = check_or_404(call, repo)
    was_completed = check.status == "completed"
    apply_check_fields(call, check)
    if check.status == "completed" and not was_completed:
        # GitHub tells the App its check run completed, as it told it of its creation.
        call.announce.append(Payloads(call.world).check_run(repo, check, "completed", BOT_LOGIN))
    return Reply(body=call.shapes.check_run(repo, check))


def get_check_run(call: Call) -> Reply:
    repo = call.repo()
    return Reply(body=call.shapes.check_run(repo, check_or_404(call, repo)))


def commit_check_runs(call: Call) -> Reply:
    repo = call.repo()
    ref = call.params["ref"]
    sha = repo.resolve(ref)
    if sha is None:
        raise validation_failed(f"No commit found for SHA: {ref}")
    checks = [c for c in repo.check_runs.values() if c.head_sha == sha]
    if "check_name" in call.query:
        checks = [c for c in checks if c.name == call.query["check_name"]]
    if "status" in call.query:
        checks = [c for c in checks if c.status == call.query["status"]]
    if call.query.get("filter", "latest") == "latest":
        latest: dict[str, CheckRun] = {}
        for check in checks:
            if check.name not in latest or check.id > latest[check.name].id:
                latest[check.name] = check
        checks = list(latest.values())
    checks.sort(key=lambda c: -c.id)
    return Reply(items=[call.shapes.check_run(repo, c) for c in checks], wrap="check_runs")


# --- collaborators ---------------------------------------------------------------------

# Legacy permission and role name per repository role.
ROLES = {
    "admin": ("admin", "admin"),
    "maintain": ("write", "maintain"),
    "write": ("write", "write"),
    "triage": ("read", "triage"),
    "read": ("read", "read"),
    "none": ("none", "none"),
}


def collaborator_permission(call: Call) -> Reply:
    """Everyone not listed is an existing user without access (a private repository)."""
    repo = call.repo()
    login = call.params["username"]
    level = next((v for k, v in repo.collaborators.items() if k.lower() == login.lower()), "none")
    permission, role = ROLES[level]
    user = call.shapes.user(login)
    user["permissions"] = {
        "admin": level == "admin",
        "maintain": level in ("admin", "maintain"),
        "push": permission in ("admin", "write"),
        "triage": level in ("admin", "maintain", "write", "triage"),
        "pull": level != "none",
    }
    user["role_name"] = role
    return Reply(body={"permission": permission, "role_name": role, "user": user})
