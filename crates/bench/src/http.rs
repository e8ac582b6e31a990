//! A minimal HTTP/1.1 client over one kept-alive loopback connection: enough for etcd's JSON
//! gateway and for scraping Prometheus metrics, and it counts the bytes it sends.

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Responses larger than this are refused (the largest benchmark object, base64, plus slack).
const BODY_BYTES_MAX: usize = 64 << 20;
const HEADER_LINES_MAX: usize = 100;

pub struct HttpConnection {
    address: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
    /// Bytes written to the socket so far, request lines and headers included.
    pub bytes_sent: u64,
}

impl HttpConnection {
    pub fn new(address: SocketAddr) -> HttpConnection {
        HttpConnection {
            address,
            stream: None,
            bytes_sent: 0,
        }
    }

    /// Sends one request and returns (status, body). Reconnects once if a kept-alive connection
    /// was closed by the server.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        let fresh = self.stream.is_none();
        match self.try_request(method, path, body).await {
            Ok(r) => Ok(r),
            Err(_) if !fresh => {
                self.stream = None;
                self.try_request(method, path, body).await
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }

    async fn try_request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.address)
                .await
                .with_context(|| format!("connecting to {}", self.address))?;
            stream.set_nodelay(true)?;
            self.stream = Some(BufReader::new(stream));
        }
        let Some(stream) = self.stream.as_mut() else {
            bail!("no connection");
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.address,
            body.len()
        );
        let mut message = Vec::with_capacity(head.len() + body.len());
        message.extend_from_slice(head.as_bytes());
        message.extend_from_slice(body);
        stream.get_mut().write_all(&message).await?;
        self.bytes_sent += message.len() as u64;
        match read_response(stream).await {
            Ok((status, body, close)) => {
                if close {
                    self.stream = None;
                }
                Ok((status, body))
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }
}

/// (status, body, whether the server will close the connection).
async fn read_response(stream: &mut BufReader<TcpStream>) -> Result<(u16, Vec<u8>, bool)> {
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        bail!("connection closed");
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .context("no status code")?
        .parse()?;
    let mut length = None;
    let mut chunked = false;
    let mut close = false;
    for _ in 0..HEADER_LINES_MAX {
        line.clear();
        stream.read_line(&mut line).await?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => length = Some(value.parse::<usize>()?),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "connection" => close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .context("chunk size")?;
            if body.len() + size > BODY_BYTES_MAX {
                bail!("response body over {BODY_BYTES_MAX} bytes");
            }
            let start = body.len();
            body.resize(start + size, 0);
            stream.read_exact(&mut body[start..]).await?;
            line.clear();
            stream.read_line(&mut line).await?;
            if size == 0 {
                break;
            }
        }
    } else if let Some(length) = length {
        if length > BODY_BYTES_MAX {
            bail!("response body over {BODY_BYTES_MAX} bytes");
        }
        body.resize(length, 0);
        stream.read_exact(&mut body).await?;
    } else {
        stream
            .take(BODY_BYTES_MAX as u64)
            .read_to_end(&mut body)
            .await?;
        close = true;
    }
    Ok((status, body, close))
}

/// Fetches Prometheus text from `http://address/metrics` and adds up every sample of `name`.
pub async fn scrape_sum(address: SocketAddr, name: &str) -> Result<f64> {
    let mut connection = HttpConnection::new(address);
    let (_, body) = connection.request("GET", "/metrics", b"").await?;
    Ok(sum_metric(&String::from_utf8_lossy(&body), name))
}

/// The sum of all samples of metric `name` (any labels) in Prometheus text format.
pub fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn metric_samples_add_up_across_labels() {
        let text = "# TYPE x counter\nx{op=\"a\"} 3\nx{op=\"b\"} 4\nx_other 100\nx 1\n";
        assert_eq!(sum_metric(text, "x"), 8.0);
        assert_eq!(sum_metric(text, "y"), 0.0);
    }

    #[tokio::test]
    async fn reads_chunked_and_sized_responses_on_one_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                .await
                .unwrap();
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                )
                .await
                .unwrap();
        });
        let mut c = HttpConnection::new(address);
        assert_eq!(
            c.request("POST", "/a", b"{}").await.unwrap(),
            (200, b"hello".to_vec())
        );
        assert_eq!(
            c.request("GET", "/b", b"").await.unwrap(),
            (404, b"abcde".to_vec())
        );
        assert!(c.bytes_sent > 2 * 40);
        server.await.unwrap();
    }
}
