//! The channels: e-mail over SMTP (lettre, STARTTLS or TLS, AUTH) and webhooks in the shapes
//! Slack and Microsoft Teams incoming webhooks take, or the finding as plain JSON.

use std::time::Duration;

use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde_json::json;

use super::{Alert, NotifyConfig, SmtpConfig, SmtpSecurity, WebhookStyle};
use gpuledger_store::NotifyState;

/// One message, whatever the channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `new`, `changed`, `resolved` or `digest`.
    pub event: String,
    pub key: String,
    pub rule: String,
    pub team: Option<String>,
    pub subject: String,
    pub lines: Vec<String>,
    pub link: String,
    pub usd_per_month: Option<f64>,
}

impl Message {
    pub fn of_alert(a: &Alert, event: &str) -> Message {
        let subject = match event {
            "changed" => format!("Changed: {}", a.subject),
            _ => a.subject.clone(),
        };
        Message {
            event: event.into(),
            key: a.key.clone(),
            rule: a.rule.clone(),
            team: a.team.clone(),
            subject,
            lines: a.lines.clone(),
            link: a.link.clone(),
            usd_per_month: a.usd_per_month,
        }
    }

    /// The "resolved" of a finding that cleared.
    pub fn resolved(s: &NotifyState, link: &str) -> Message {
        Message {
            event: "resolved".into(),
            key: s.key.clone(),
            rule: s.rule.clone(),
            team: None,
            subject: format!("Resolved: {}", s.subject),
            lines: vec![format!(
                "This finding no longer holds (first reported {}).",
                chrono::DateTime::from_timestamp(s.opened_at, 0)
                    .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                    .unwrap_or_default()
            )],
            link: link.to_string(),
            usd_per_month: None,
        }
    }

    /// The plain-text body of the e-mail, and the text of chat messages.
    pub fn text(&self) -> String {
        let mut t = self.lines.join("\n");
        t.push_str(&format!("\n\nEvidence: {}\n", self.link));
        t.push_str(&format!(
            "\n-- \ngpuledger, rule `{}` ({}). One message per finding until it changes or \
             clears; then a \"resolved\".\n",
            self.rule, self.key
        ));
        t
    }

    /// The JSON body a webhook of `style` takes.
    pub fn webhook_body(&self, style: WebhookStyle) -> serde_json::Value {
        match style {
            WebhookStyle::Slack => json!({
                "text": format!("*{}*\n{}\n<{}|Open in gpuledger>", self.subject,
                    self.lines.join("\n"), self.link),
            }),
            WebhookStyle::Teams => json!({
                "@type": "MessageCard",
                "@context": "https://schema.org/extensions",
                "summary": self.subject,
                "themeColor": if self.event == "resolved" { "2EB886" } else { "D9822B" },
                "title": self.subject,
                "text": self.lines.join("<br>"),
                "potentialAction": [{
                    "@type": "OpenUri",
                    "name": "Open in gpuledger",
                    "targets": [{"os": "default", "uri": self.link}],
                }],
            }),
            WebhookStyle::Generic => json!({
                "event": self.event,
                "key": self.key,
                "rule": self.rule,
                "team": self.team,
                "subject": self.subject,
                "lines": self.lines,
                "link": self.link,
                "usd_per_month": self.usd_per_month,
            }),
        }
    }
}

/// Sends messages: one SMTP transport (when configured) and one HTTP client.
pub struct Sender {
    smtp: Option<SmtpConfig>,
    http: reqwest::Client,
}

impl Sender {
    pub fn new(config: &NotifyConfig) -> Sender {
        let smtp = config.smtp.clone();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Sender { smtp, http }
    }

    /// Send `msg` to `to` over SMTP.
    pub async fn email(&self, to: &str, msg: &Message) -> Result<(), String> {
        let Some(cfg) = &self.smtp else {
            return Err("no [notifications.smtp] server is configured".into());
        };
        let from: Mailbox = cfg
            .from
            .parse()
            .map_err(|e| format!("notifications.smtp.from: {e}"))?;
        let to: Mailbox = to.parse().map_err(|e| format!("address `{to}`: {e}"))?;
        let email = lettre::Message::builder()
            .from(from)
            .to(to)
            .subject(format!("[gpuledger] {}", msg.subject))
            .header(ContentType::TEXT_PLAIN)
            .body(msg.text())
            .map_err(|e| format!("the message: {e}"))?;
        // The password is read on every message, so a rotated one needs no restart.
        let creds = match (&cfg.username, &cfg.password_file) {
            (Some(user), Some(file)) => {
                let pw = std::fs::read_to_string(file).map_err(|e| {
                    format!("notifications.smtp.password_file {}: {e}", file.display())
                })?;
                Some(Credentials::new(user.clone(), pw.trim().to_string()))
            }
            _ => None,
        };
        let transport = transport(cfg, creds)?;
        transport
            .send(email)
            .await
            .map(|_| ())
            .map_err(|e| format!("SMTP {}:{}: {e}", cfg.host, cfg.port))
    }

    /// POST `msg` to a webhook.
    pub async fn webhook(
        &self,
        url: &str,
        style: WebhookStyle,
        msg: &Message,
    ) -> Result<(), String> {
        let host = reqwest::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().map(String::from))
            .unwrap_or_else(|| "the webhook".into());
        let resp = self
            .http
            .post(url)
            .json(&msg.webhook_body(style))
            .send()
            .await
            .map_err(|e| format!("webhook at {host}: {}", without_url(&e)))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("webhook at {host} answered {}", resp.status()))
        }
    }
}

/// A reqwest error's text without the URL (a webhook's URL is its secret).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "<webhook>");
    }
    s
}

fn tls_parameters(c: &SmtpConfig) -> Result<TlsParameters, String> {
    let mut b = TlsParameters::builder(c.host.clone());
    if let Some(ca) = &c.ca_file {
        let pem = std::fs::read(ca)
            .map_err(|e| format!("notifications.smtp.ca_file {}: {e}", ca.display()))?;
        let cert = Certificate::from_pem(&pem)
            .map_err(|e| format!("notifications.smtp.ca_file {}: {e}", ca.display()))?;
        b = b.add_root_certificate(cert);
    }
    b.build_rustls()
        .map_err(|e| format!("notifications.smtp TLS settings: {e}"))
}

/// A transport for `c`, logging in with `creds` when given.
fn transport(
    c: &SmtpConfig,
    creds: Option<Credentials>,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let tls = match c.security {
        SmtpSecurity::StartTls => Tls::Required(tls_parameters(c)?),
        SmtpSecurity::Tls => Tls::Wrapper(tls_parameters(c)?),
        SmtpSecurity::None => Tls::None,
    };
    let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(c.host.clone())
        .port(c.port)
        .tls(tls)
        .timeout(Some(Duration::from_secs(20)));
    if let Some(creds) = creds {
        b = b.credentials(creds);
    }
    Ok(b.build())
}
