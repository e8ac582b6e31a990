//! An anchor in a TPM 2.0 monotonic counter, reached through the TPM software stack (tss-esapi):
//! a rollback of the whole disk, the component's directory and any anchor file with it, is caught
//! at start, because the counter is not on the disk and never goes back.
//!
//! The component's generation *is* the counter's value. A counter index can only be incremented,
//! one at a time; and a counter index that is deleted and defined again starts, at its first
//! increment, from the highest value any counter of that TPM ever held (TPM 2.0 part 1, NV
//! counters). So no one who can only send the TPM commands (the host's owner included) can bring
//! the counter back to a generation the state has passed: a restored state is behind it.
//!
//! The index also names its trusted log: its `authPolicy`, fixed when the index is defined and
//! covered by the index's name, holds the log's 32-byte public key. The index is read and
//! incremented with its own (empty) authorization, never by policy, so the field authorizes
//! nothing; it only says whose counter this is. The anchor also seals the log's signing key
//! ([`Anchor::seal`]), so that only this TPM can open it.
//!
//! What it does not stop: the local host. Anyone who can use this TPM (root, or the `tss` group
//! on `/dev/tpmrm0`) can open the sealed key and sign, advance the counter (the log then refuses
//! to start, as after a rollback), or edit the store and its generation together. It stops a
//! restored disk and a copy of the directory on another machine.

#[cfg(not(feature = "tpm"))]
use bulwark_core::sign::PublicKey;

#[cfg(not(feature = "tpm"))]
use crate::anchor::{Anchor, AnchorKind, Mark};

/// The first NV index of the owner's range a user may define (TPM 2.0 part 2, `TPM_HT_NV_INDEX`
/// with the "owner" sub-range 0x0150_0000 to 0x015f_ffff, which TCG leaves to applications).
pub const INDEX_FIRST: u32 = 0x0150_0000;
/// The last index of that range.
pub const INDEX_LAST: u32 = 0x015f_ffff;

/// A component's generation, kept in a counter index of a TPM.
pub struct TpmAnchor {
    tcti: String,
    index: u32,
    #[cfg(feature = "tpm")]
    tpm: Option<imp::Tpm>,
}

impl TpmAnchor {
    /// The counter at NV `index` of the TPM that `tcti` reaches (`device:/dev/tpmrm0` for the
    /// machine's TPM through the kernel's resource manager, `swtpm:host=127.0.0.1,port=2321` for
    /// an emulator). Nothing is sent to the TPM until the anchor is used.
    pub fn new(tcti: &str, index: u32) -> Result<TpmAnchor, String> {
        if !(INDEX_FIRST..=INDEX_LAST).contains(&index) {
            return Err(format!(
                "TPM NV index {index:#010x} is outside the range for applications \
                 ({INDEX_FIRST:#010x} to {INDEX_LAST:#010x})"
            ));
        }
        if !cfg!(feature = "tpm") {
            return Err(
                "this bulwark was built without TPM support: build it with `--features tpm` \
                 (it needs Debian's libtss2-dev)"
                    .to_string(),
            );
        }
        Ok(TpmAnchor {
            tcti: tcti.to_string(),
            index,
            #[cfg(feature = "tpm")]
            tpm: None,
        })
    }

    /// The NV index of its counter.
    pub fn index(&self) -> u32 {
        self.index
    }

    fn description(&self) -> String {
        format!("TPM NV index {:#010x} via {}", self.index, self.tcti)
    }
}

#[cfg(not(feature = "tpm"))]
impl Anchor for TpmAnchor {
    fn read(&mut self) -> Result<Option<Mark>, String> {
        Err("no TPM support in this build".to_string())
    }

    fn record(&mut self, _: Mark) -> Result<(), String> {
        Err("no TPM support in this build".to_string())
    }

    fn claim(&mut self, _: PublicKey) -> Result<u64, String> {
        Err("no TPM support in this build".to_string())
    }

    fn kind(&self) -> AnchorKind {
        AnchorKind::Tpm { index: self.index }
    }

    fn describe(&self) -> String {
        self.description()
    }
}

#[cfg(all(test, feature = "tpm"))]
pub(crate) use imp::counter_public;

#[cfg(feature = "tpm")]
mod imp {
    use std::str::FromStr;

    use bulwark_core::sign::PublicKey;
    use tss_esapi::Context;
    use tss_esapi::attributes::NvIndexAttributesBuilder;
    use tss_esapi::attributes::ObjectAttributesBuilder;
    use tss_esapi::constants::CapabilityType;
    use tss_esapi::constants::nv_index_type::NvIndexType;
    use tss_esapi::handles::KeyHandle;
    use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle, TpmHandle};
    use tss_esapi::interface_types::algorithm::HashingAlgorithm;
    use tss_esapi::interface_types::algorithm::PublicAlgorithm;
    use tss_esapi::interface_types::ecc::EccCurve;
    use tss_esapi::interface_types::resource_handles::Hierarchy;
    use tss_esapi::interface_types::resource_handles::{NvAuth, Provision};
    use tss_esapi::interface_types::session_handles::AuthSession;
    use tss_esapi::structures::{
        CapabilityData, Digest, EccPoint, KeyedHashScheme, NvPublic, NvPublicBuilder, Private,
        Public, PublicBuilder, PublicEccParametersBuilder, PublicKeyedHashParameters,
        SensitiveData, SymmetricDefinitionObject,
    };
    use tss_esapi::tcti_ldr::TctiNameConf;
    use tss_esapi::traits::{Marshall, UnMarshall};

    use super::TpmAnchor;
    use crate::anchor::{Anchor, AnchorKind, Mark};

    /// The public area of the counter a log with `key` keeps at `index`: read and incremented
    /// with its own empty authorization, never through a policy, and named by the key.
    pub(crate) fn counter_public(index: u32, key: PublicKey) -> Result<NvPublic, String> {
        let attributes = NvIndexAttributesBuilder::new()
            .with_nv_index_type(NvIndexType::Counter)
            .with_auth_read(true)
            .with_auth_write(true)
            .with_no_da(true)
            .build()
            .map_err(|error| error.to_string())?;
        let label = Digest::try_from(key.as_bytes().to_vec()).map_err(|error| error.to_string())?;
        NvPublicBuilder::new()
            .with_nv_index(NvIndexTpmHandle::new(index).map_err(|error| error.to_string())?)
            .with_index_name_algorithm(HashingAlgorithm::Sha256)
            .with_index_attributes(attributes)
            .with_index_auth_policy(label)
            .with_data_area_size(usize::from(COUNTER_BYTES))
            .build()
            .map_err(|error| error.to_string())
    }

    /// An open session with the TPM, and what it has learnt of the counter.
    pub(super) struct Tpm {
        context: Context,
        /// The counter's handle, once the index is known to exist.
        handle: Option<NvIndexHandle>,
        /// The log the index names, and its count, as last read or set by this process; every
        /// increment is read back to keep it true, and any failure forgets it.
        known: Option<Mark>,
    }

    const COUNTER_BYTES: u16 = 8;

    /// The index's, the owner's and the sealed object's authorizations are empty passwords: a
    /// password session costs no round trip of its own (an HMAC session costs two more, to
    /// start and flush it), and an empty authorization sent in the clear gives nothing away.
    const PASSWORD: Option<AuthSession> = Some(AuthSession::Password);

    impl TpmAnchor {
        fn tpm(&mut self) -> Result<&mut Tpm, String> {
            if self.tpm.is_none() {
                let tcti = TctiNameConf::from_str(&self.tcti)
                    .map_err(|error| format!("the TPM address {:?}: {error}", self.tcti))?;
                let context = Context::new(tcti)
                    .map_err(|error| format!("reaching the TPM at {}: {error}", self.tcti))?;
                self.tpm = Some(Tpm {
                    context,
                    handle: None,
                    known: None,
                });
            }
            self.tpm
                .as_mut()
                .ok_or_else(|| "the TPM is not connected".to_string())
        }

        fn nv_handle(&self) -> Result<NvIndexTpmHandle, String> {
            NvIndexTpmHandle::new(self.index).map_err(|error| error.to_string())
        }

        /// Whether the index is defined, asked without naming it (naming an undefined index
        /// makes the TPM stack log an error).
        fn defined(&mut self) -> Result<bool, String> {
            let index = self.index;
            let tpm = self.tpm()?;
            let (data, _) = tpm
                .context
                .get_capability(CapabilityType::Handles, index, 1)
                .map_err(|error| format!("listing the TPM's NV indices: {error}"))?;
            Ok(match data {
                CapabilityData::Handles(handles) => handles
                    .into_inner()
                    .first()
                    .is_some_and(|handle| u32::from(*handle) == index),
                _ => false,
            })
        }

        fn open(&mut self) -> Result<NvIndexHandle, String> {
            let nv = self.nv_handle()?;
            let tpm = self.tpm()?;
            if let Some(handle) = tpm.handle {
                return Ok(handle);
            }
            let handle: NvIndexHandle = tpm
                .context
                .execute_without_session(|context| {
                    context.tr_from_tpm_public(TpmHandle::NvIndex(nv))
                })
                .map_err(|error| format!("opening TPM NV index {:#010x}: {error}", u32::from(nv)))?
                .into();
            tpm.handle = Some(handle);
            Ok(handle)
        }

        /// The log the index names and its count, checked to be a counter this anchor made.
        fn fetch(&mut self) -> Result<Mark, String> {
            let index = self.index;
            let handle = self.open()?;
            let tpm = self.tpm()?;
            let (public, _) = tpm
                .context
                .execute_without_session(|context| context.nv_read_public(handle))
                .map_err(|error| format!("reading TPM NV index {index:#010x}: {error}"))?;
            let attributes = public.attributes();
            let counter = attributes.index_type().ok() == Some(NvIndexType::Counter)
                && attributes.auth_read()
                && attributes.auth_write()
                && !attributes.policy_read()
                && !attributes.policy_write()
                && public.data_size() == usize::from(COUNTER_BYTES);
            if !counter {
                return Err(format!(
                    "TPM NV index {index:#010x} is not a trusted log's counter (another program \
                     defined it)"
                ));
            }
            let key: [u8; 32] = public
                .authorization_policy()
                .value()
                .try_into()
                .map_err(|_| {
                    format!("TPM NV index {index:#010x} names no trusted log in its policy")
                })?;
            let key = PublicKey::from_bytes(&key).map_err(|_| {
                format!("TPM NV index {index:#010x} names no trusted log in its policy")
            })?;
            let generation = self.count()?;
            let mark = Mark { key, generation };
            self.tpm()?.known = Some(mark);
            Ok(mark)
        }

        /// The counter's value now.
        fn count(&mut self) -> Result<u64, String> {
            let index = self.index;
            let handle = self.open()?;
            let count = self
                .tpm()?
                .context
                .execute_with_session(PASSWORD, |context| {
                    context.nv_read(NvAuth::NvIndex(handle), handle, COUNTER_BYTES, 0)
                })
                .map_err(|error| {
                    format!("reading the count of TPM NV index {index:#010x}: {error}")
                })?;
            let count: [u8; 8] = count.value().try_into().map_err(|_| {
                format!("TPM NV index {index:#010x} answered a count that is not 8 bytes")
            })?;
            Ok(u64::from_be_bytes(count))
        }

        fn increment(&mut self) -> Result<(), String> {
            let index = self.index;
            let handle = self.open()?;
            let tpm = self.tpm()?;
            tpm.context
                .execute_with_session(PASSWORD, |context| {
                    context.nv_increment(NvAuth::NvIndex(handle), handle)
                })
                .map_err(|error| format!("incrementing TPM NV index {index:#010x}: {error}"))
        }

        /// Runs `step`, forgetting what is known of the TPM if it fails: after an error, the
        /// count is read again before it is trusted.
        fn guarded<T>(
            &mut self,
            step: impl FnOnce(&mut TpmAnchor) -> Result<T, String>,
        ) -> Result<T, String> {
            let result = step(self);
            if result.is_err() {
                self.tpm = None;
            }
            result
        }
    }

    impl Anchor for TpmAnchor {
        fn read(&mut self) -> Result<Option<Mark>, String> {
            self.guarded(|anchor| {
                if !anchor.defined()? {
                    return Ok(None);
                }
                anchor.fetch().map(Some)
            })
        }

        fn record(&mut self, mark: Mark) -> Result<(), String> {
            self.guarded(|anchor| {
                let known = match anchor.tpm()?.known {
                    Some(known) => known,
                    None => anchor.fetch()?,
                };
                if known.key != mark.key {
                    return Err(format!(
                        "TPM NV index {:#010x} counts for trusted log {}, not {}",
                        anchor.index, known.key, mark.key
                    ));
                }
                if known.generation == mark.generation {
                    return Ok(());
                }
                if known.generation.checked_add(1) != Some(mark.generation) {
                    return Err(format!(
                        "TPM NV index {:#010x} is at {}, so it cannot record generation {}",
                        anchor.index, known.generation, mark.generation
                    ));
                }
                anchor.increment()?;
                // Read back: a second process advancing the same counter (a copy of this log
                // on the same machine, under the same TPM) is caught at its first change,
                // before either attests anything about it.
                let now = anchor.count()?;
                if now != mark.generation {
                    return Err(format!(
                        "TPM NV index {:#010x} is at {now} after an increment to {}: another \
                         process advances this log's counter (a copy of this trusted log?)",
                        anchor.index, mark.generation
                    ));
                }
                anchor.tpm()?.known = Some(mark);
                Ok(())
            })
        }

        fn claim(&mut self, key: PublicKey) -> Result<u64, String> {
            self.guarded(|anchor| {
                let index = anchor.index;
                if anchor.defined()? {
                    let holder = anchor
                        .fetch()
                        .map(|mark| format!("the counter of trusted log {}", mark.key))
                        .unwrap_or_else(|_| "another program's data".to_string());
                    return Err(format!(
                        "TPM NV index {index:#010x} already holds {holder}; choose another index, \
                         or remove it (`tpm2_nvundefine {index:#010x}`) only if that log is retired"
                    ));
                }
                let public = counter_public(index, key)?;
                let tpm = anchor.tpm()?;
                let handle = tpm
                    .context
                    .execute_with_session(PASSWORD, |context| {
                        context.nv_define_space(Provision::Owner, None, public)
                    })
                    .map_err(|error| {
                        format!(
                            "defining TPM NV index {index:#010x} (with the owner's authorization, \
                             which must be empty): {error}"
                        )
                    })?;
                tpm.handle = Some(handle);
                // The first increment starts the counter at the highest count this TPM's
                // counters ever held: a new identity's generations start above every old one.
                anchor.increment()?;
                let mark = anchor.fetch()?;
                if mark.key != key {
                    return Err(format!(
                        "TPM NV index {index:#010x} was defined for {key} but names {}",
                        mark.key
                    ));
                }
                Ok(mark.generation)
            })
        }

        fn kind(&self) -> AnchorKind {
            AnchorKind::Tpm { index: self.index }
        }

        fn describe(&self) -> String {
            self.description()
        }

        fn release(&mut self) -> Result<(), String> {
            self.guarded(|anchor| {
                let index = anchor.index;
                let handle = anchor.open()?;
                let tpm = anchor.tpm()?;
                tpm.context
                    .execute_with_session(PASSWORD, |context| {
                        context.nv_undefine_space(Provision::Owner, handle)
                    })
                    .map_err(|error| format!("removing TPM NV index {index:#010x}: {error}"))?;
                tpm.handle = None;
                tpm.known = None;
                Ok(())
            })
        }

        fn seal(&mut self, seed: &[u8; 32]) -> Result<Option<Vec<u8>>, String> {
            self.guarded(|anchor| {
                let context = &mut anchor.tpm()?.context;
                let data =
                    SensitiveData::try_from(seed.to_vec()).map_err(|error| error.to_string())?;
                let sealed = with_parent(context, |context, parent| {
                    context.create(parent, sealed_public()?, None, Some(data), None, None)
                })
                .map_err(|error| format!("sealing the key in the TPM: {error}"))?;
                let private = sealed.out_private.value();
                let public = sealed
                    .out_public
                    .marshall()
                    .map_err(|error| format!("encoding the sealed key: {error}"))?;
                let private_len = u16::try_from(private.len())
                    .map_err(|_| "the sealed key is too large".to_string())?;
                let mut blob = Vec::with_capacity(2 + private.len() + public.len());
                blob.extend_from_slice(&private_len.to_be_bytes());
                blob.extend_from_slice(private);
                blob.extend_from_slice(&public);
                Ok(Some(blob))
            })
        }

        fn unseal(&mut self, blob: &[u8]) -> Result<[u8; 32], String> {
            // The blob comes from the disk: bounded and parsed, never trusted.
            let damaged = || "the sealed key is damaged".to_string();
            if blob.len() > SEALED_BYTES_MAX {
                return Err(damaged());
            }
            let (len, rest) = blob.split_at_checked(2).ok_or_else(damaged)?;
            let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
            let (private, public) = rest.split_at_checked(len).ok_or_else(damaged)?;
            let private = Private::try_from(private.to_vec()).map_err(|_| damaged())?;
            let public = Public::unmarshall(public).map_err(|_| damaged())?;
            self.guarded(|anchor| {
                let context = &mut anchor.tpm()?.context;
                let seed = with_parent(context, |context, parent| {
                    let key = context.load(parent, private, public)?;
                    let opened = context.unseal(key.into());
                    let flushed = context.flush_context(key.into());
                    let opened = opened?;
                    flushed?;
                    Ok(opened)
                })
                .map_err(|error| {
                    format!(
                        "the TPM cannot open this trusted log's key ({error}): it was sealed by \
                         another TPM, or this TPM was cleared since"
                    )
                })?;
                seed.value()
                    .try_into()
                    .map_err(|_| "the TPM opened a key that is not 32 bytes".to_string())
            })
        }
    }

    /// A sealed key and its public area are a few hundred bytes.
    const SEALED_BYTES_MAX: usize = 2048;

    /// Runs `step` under the owner hierarchy's storage key, flushed afterwards. The key is
    /// derived again each time from the TPM's owner seed and a fixed template: the same TPM
    /// makes the same key, any other TPM (or this one after a clear) another, which cannot open
    /// what this one sealed.
    fn with_parent<T>(
        context: &mut Context,
        step: impl FnOnce(&mut Context, KeyHandle) -> tss_esapi::Result<T>,
    ) -> tss_esapi::Result<T> {
        let parent = context.execute_with_session(PASSWORD, |context| {
            context.create_primary(Hierarchy::Owner, storage_public()?, None, None, None, None)
        })?;
        let result =
            context.execute_with_session(PASSWORD, |context| step(context, parent.key_handle));
        let flushed = context.flush_context(parent.key_handle.into());
        let result = result?;
        flushed?;
        Ok(result)
    }

    /// An ECC P-256 storage key (restricted, decrypting, AES-128-CFB for its children): ECC,
    /// because deriving an RSA primary key takes a prime search every time.
    fn storage_public() -> tss_esapi::Result<Public> {
        let attributes = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            .with_sensitive_data_origin(true)
            .with_user_with_auth(true)
            .with_no_da(true)
            .with_decrypt(true)
            .with_restricted(true)
            .build()?;
        PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attributes)
            .with_ecc_parameters(
                PublicEccParametersBuilder::new_restricted_decryption_key(
                    SymmetricDefinitionObject::AES_128_CFB,
                    EccCurve::NistP256,
                )
                .build()?,
            )
            .with_ecc_unique_identifier(EccPoint::default())
            .build()
    }

    /// A sealed data object that never leaves this TPM (fixedTPM, fixedParent), opened with its
    /// empty authorization.
    fn sealed_public() -> tss_esapi::Result<Public> {
        let attributes = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            .with_no_da(true)
            .with_user_with_auth(true)
            .build()?;
        PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::KeyedHash)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attributes)
            .with_keyed_hash_parameters(PublicKeyedHashParameters::new(KeyedHashScheme::Null))
            .with_keyed_hash_unique_identifier(Default::default())
            .build()
    }
}
