"""Webhook event names: the ones Klaud knows, and the metric label each name may use.

The `X-GitHub-Event` header of a request is chosen by whoever sends it, so a name only
becomes a label value of its own when Klaud handles it or GitHub documents it; every
other name shares one value, and /metrics stays bounded whatever is sent.
"""

from __future__ import annotations

from bot.core.events import RECONCILE_REQUEST

# app.yaml's `default_events`, plus what GitHub delivers to every App (ping, installation
# events) and the events the dashboard and check-run re-runs arrive as.
KLAUD_EVENTS = frozenset(
    {
        "pull_request",
        "push",
        "workflow_run",
        "issue_comment",
        "check_run",
        "repository_dispatch",
        "repository",
        "ping",
        "installation",
        "installation_repositories",
        "check_suite",
        "issues",
    }
)

# GitHub's documented webhook events ("Webhook events and payloads").
GITHUB_EVENTS = KLAUD_EVENTS | {
    "branch_protection_configuration",
    "branch_protection_rule",
    "code_scanning_alert",
    "commit_comment",
    "create",
    "custom_property",
    "custom_property_values",
    "delete",
    "dependabot_alert",
    "deploy_key",
    "deployment",
    "deployment_protection_rule",
    "deployment_review",
    "deployment_status",
    "discussion",
    "discussion_comment",
    "fork",
    "github_app_authorization",
    "gollum",
    "installation_target",
    "issue_dependencies",
    "label",
    "marketplace_purchase",
    "member",
    "membership",
    "merge_group",
    "meta",
    "milestone",
    "org_block",
    "organization",
    "package",
    "page_build",
    "personal_access_token_request",
    "project",
    "project_card",
    "project_column",
    "projects_v2",
    "projects_v2_item",
    "projects_v2_status_update",
    "public",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "registry_package",
    "release",
    "repository_advisory",
    "repository_import",
    "repository_ruleset",
    "repository_vulnerability_alert",
    "secret_scanning_alert",
    "secret_scanning_alert_location",
    "secret_scanning_scan",
    "security_advisory",
    "security_and_analysis",
    "sponsorship",
    "star",
    "status",
    "sub_issues",
    "team",
    "team_add",
    "watch",
    "workflow_dispatch",
    "workflow_job",
}

OTHER = "other"


def event_label(name: str) -> str:
    """The `event` label value for a header value: the name itself only when it is known."""
    return name if name in GITHUB_EVENTS or name == RECONCILE_REQUEST else OTHER
