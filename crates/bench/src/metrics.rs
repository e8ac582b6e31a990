//! Prometheus metrics read over HTTP with hyper's client: the benchmark's count of the bytes
//! Bulwark's nodes took in.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// A metrics page larger than this is refused.
const PAGE_BYTES_MAX: usize = 16 << 20;

/// Fetches Prometheus text from `http://address/metrics` and adds up every sample of `name`.
pub async fn scrape_sum(address: SocketAddr, name: &str) -> Result<f64> {
    let stream = TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to {address}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get("/metrics")
        .header(hyper::header::HOST, address.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await;
    let page = match response {
        Ok(response) if response.status().is_success() => {
            Limited::new(response.into_body(), PAGE_BYTES_MAX)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .map_err(|error| anyhow::anyhow!("reading {address}/metrics: {error}"))
        }
        Ok(response) => Err(anyhow::anyhow!(
            "{address}/metrics: status {}",
            response.status()
        )),
        Err(error) => Err(error.into()),
    };
    driver.abort();
    let page = page?;
    if page.is_empty() {
        bail!("{address}/metrics: an empty page");
    }
    Ok(sum_metric(&String::from_utf8_lossy(&page), name))
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
    async fn a_chunked_metrics_page_is_read_and_summed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let read = socket.read(&mut buf).await.unwrap();
            assert!(buf[..read].starts_with(b"GET /metrics HTTP/1.1\r\n"));
            socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                      7\r\nx{a} 3\n\r\n9\r\nx{b} 4.5\n\r\n0\r\n\r\n",
                )
                .await
                .unwrap();
        });
        assert_eq!(scrape_sum(address, "x").await.unwrap(), 7.5);
        server.await.unwrap();
    }
}
